// How the page draws the QC layer (qc/<slide>.geojson of `wsi tile`), as the QC picture does
// (wsi/tiling/qc.py): kept tiles and unreadable ones as thin outlines, so the tissue shows in its own
// colours; every other rejected tile filled half transparent in its reason's colour (the classification's,
// Okabe & Ito's colour-blind-safe palette) with a border of it; the tissue outline as black and white
// dashes. Loaded by the page before viewer.js; node loads it too (tests/wsi/view/test_qc_style.py).
"use strict";

const QC_OUTLINED = new Set(["kept", "unreadable"]);

// props: a feature's properties; name: its class name; rgb: its class colour [r, g, b]
// -> {stroke, width, dash: [on, off] | [], dashStroke: the gaps' colour | null, fill: css colour | null}
function qcStyle(props, name, rgb) {
  const [r, g, b] = rgb, css = `rgb(${r},${g},${b})`;
  const type = props && props.objectType;
  if (type === "annotation") return { stroke: "rgb(0,0,0)", width: 2, dash: [6, 6], dashStroke: "rgb(255,255,255)", fill: null };
  if (type === "tile" && !QC_OUTLINED.has(name)) return { stroke: css, width: 1.5, dash: [], dashStroke: null, fill: `rgba(${r},${g},${b},0.5)` };
  return { stroke: css, width: 1, dash: [], dashStroke: null, fill: null };
}

if (typeof module !== "undefined") module.exports = { qcStyle, QC_OUTLINED };
