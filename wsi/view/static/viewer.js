// wsi view: the slide list, an OpenSeadragon viewer of /slides/<id>.dzi, and the overlays drawn on a canvas
// from the JSON of /api/slides/<id>/overlays (every position in level-0 pixels). No network beyond this
// server. URL parameters: ?slide=<id>&output=<name>&opacity=<0..1> (report.html links use ?slide=).
"use strict";

const el = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const state = { slides: [], sortKey: "id", sortDir: 1, current: null, overlays: null, geo: {}, geoOn: {} };
// matplotlib's RdBu_r, the colour map of the heatmap PNGs (pipelines/inputs/heatmaps.py): blue against, red towards
const RDBU_R = [[5, 48, 97], [33, 102, 172], [67, 147, 195], [146, 197, 222], [209, 229, 240], [247, 247, 247],
  [253, 219, 199], [244, 165, 130], [214, 96, 77], [178, 24, 43], [103, 0, 31]];
const PALETTE = [[230, 159, 0], [86, 180, 233], [0, 158, 115], [240, 228, 66], [0, 114, 178], [213, 94, 0],
  [204, 121, 167], [120, 120, 120]];

function diverging(t) { // t in [-1, 1] -> [r, g, b]
  const x = (Math.max(-1, Math.min(1, t)) + 1) / 2 * (RDBU_R.length - 1);
  const i = Math.min(Math.floor(x), RDBU_R.length - 2), f = x - i;
  return RDBU_R[i].map((c, k) => Math.round(c + (RDBU_R[i + 1][k] - c) * f));
}

const viewer = OpenSeadragon({
  id: "osd", prefixUrl: "/static/openseadragon/images/", showNavigator: true, maxZoomPixelRatio: 4,
  imageLoaderLimit: 8, timeout: 60000, crossOriginPolicy: false, immediateRender: true,
});
let tilesLoaded = 0;
viewer.addHandler("tile-loaded", () => { tilesLoaded += 1; document.body.dataset.tilesLoaded = String(tilesLoaded); });
viewer.addHandler("open", () => {
  document.body.dataset.fullyLoaded = "false";
  viewer.world.getItemAt(0).addHandler("fully-loaded-change", (e) => { document.body.dataset.fullyLoaded = String(e.fullyLoaded); });
});
viewer.addHandler("open-failed", (e) => problem(`slide: ${e.message}`));
for (const ev of ["animation", "open", "resize", "update-viewport"]) viewer.addHandler(ev, draw);

function problem(text) { el("problems").textContent = text; }

function cell(v) { const n = Number(v); return v !== "" && v !== undefined && Number.isFinite(n) ? n : v; }

async function loadList() {
  const res = await fetch("/api/slides");
  const data = await res.json();
  el("folder").textContent = `${data.folder} (${data.kind})`;
  state.slides = data.slides;
  renderList();
  const wanted = params.get("slide");
  const first = state.slides.find((s) => s.id === wanted) || state.slides.find((s) => s.viewable);
  if (wanted && !state.slides.some((s) => s.id === wanted)) problem(`no slide ${wanted} in this folder`);
  if (first) openSlide(first.id); else document.body.dataset.state = "empty";
}

function columns() {
  const cols = ["id", "status"];
  for (const s of state.slides) for (const k of Object.keys(s.prediction)) if (!cols.includes(k)) cols.push(k);
  return cols;
}

function value(s, k) { return k === "id" ? s.id : k === "status" ? s.status : cell(s.prediction[k] ?? ""); }

function renderList() {
  const cols = columns();
  const head = document.createElement("tr");
  for (const k of cols) {
    const th = document.createElement("th");
    th.textContent = k;
    if (k === state.sortKey) th.className = state.sortDir > 0 ? "asc" : "desc";
    th.addEventListener("click", () => {
      state.sortDir = state.sortKey === k ? -state.sortDir : 1; state.sortKey = k; renderList();
    });
    head.appendChild(th);
  }
  el("slides").tHead.replaceChildren(head);
  const rows = [...state.slides].sort((a, b) => {
    const x = value(a, state.sortKey), y = value(b, state.sortKey);
    if (typeof x === "number" && typeof y === "number") return (x - y) * state.sortDir;
    return String(x).localeCompare(String(y), undefined, { numeric: true }) * state.sortDir;
  });
  const body = el("slides").tBodies[0];
  body.replaceChildren();
  for (const s of rows) {
    const tr = document.createElement("tr");
    tr.dataset.id = s.id;
    if (!s.viewable) { tr.className = "missing"; tr.title = s.why_missing || s.error; }
    if (state.current === s.id) tr.classList.add("open");
    for (const k of cols) {
      const td = document.createElement("td");
      const v = value(s, k);
      td.textContent = typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : String(v);
      tr.appendChild(td);
    }
    tr.addEventListener("click", () => s.viewable ? openSlide(s.id) : problem(`${s.id}: ${s.why_missing || s.error}`));
    body.appendChild(tr);
  }
}

async function openSlide(id) {
  state.current = id; state.overlays = null; state.geo = {}; state.geoOn = {};
  document.body.dataset.state = "loading";
  renderList(); problem("");
  el("title").textContent = id;
  const res = await fetch(`/api/slides/${encodeURIComponent(id)}/overlays`);
  if (!res.ok) { problem(`${id}: ${await res.text()}`); document.body.dataset.state = "error"; return; }
  const ov = await res.json();
  if (state.current !== id) return;
  state.overlays = ov;
  const pred = Object.entries(ov.prediction).map(([k, v]) => `${k} ${typeof cell(v) === "number" ? cell(v).toFixed(3) : v}`);
  el("prediction").textContent = pred.length ? `prediction: ${pred.join(", ")}` : (ov.status ? `status: ${ov.status}` : "");
  const select = el("output");
  select.replaceChildren();
  const outs = ov.heat ? Object.keys(ov.heat.outputs) : [];
  for (const name of outs) select.add(new Option(name, name));
  const wanted = params.get("output") || (ov.heat && ov.heat.predicted) || outs[0];
  if (outs.includes(wanted)) select.value = wanted;
  select.disabled = el("show-heat").disabled = !outs.length;
  el("show-tiles").disabled = !ov.tiles;
  el("show-tiles").checked = !!ov.tiles && !outs.length;
  const layers = el("layers");
  layers.replaceChildren();
  for (const name of ov.geojson) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox"; box.dataset.layer = name; box.checked = name === "qc" && !outs.length;
    box.addEventListener("change", () => toggleGeo(id, name, box.checked));
    label.append(box, ` ${name} objects`);
    layers.appendChild(label);
    if (box.checked) toggleGeo(id, name, true);
  }
  el("qc-link").hidden = !ov.qc_png;
  if (ov.qc_png) el("qc-link").href = "/" + ov.qc_png.split("/").map(encodeURIComponent).join("/");
  if (ov.problems.length) problem(ov.problems.join("; "));
  viewer.open(`/slides/${encodeURIComponent(id)}.dzi`);
  document.body.dataset.state = "ready";
  draw();
}

async function toggleGeo(id, name, on) {
  state.geoOn[name] = on;
  if (on && !state.geo[name]) {
    const res = await fetch(`/api/slides/${encodeURIComponent(id)}/geojson/${name}`);
    if (!res.ok) { problem(`${name} objects: ${await res.text()}`); return; }
    const data = await res.json();
    if (state.current !== id) return;
    state.geo[name] = Array.isArray(data) ? data : (data.features || [data]);
  }
  draw();
}

function qupathColor(props, name, classes) {
  const c = props && props.classification;
  if (c && Array.isArray(c.color)) return c.color;
  const rgb = c && (c.colorRGB ?? c.color);
  if (typeof rgb === "number") return [(rgb >> 16) & 255, (rgb >> 8) & 255, rgb & 255];
  if (!classes.has(name)) classes.set(name, PALETTE[classes.size % PALETTE.length]);
  return classes.get(name);
}

function draw() {
  const canvas = el("overlay"), ov = state.overlays;
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(h * ratio)) {
    canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const legend = [];
  if (!ov || !viewer.world.getItemCount()) { el("legend").replaceChildren(); return; }
  const item = viewer.world.getItemAt(0);
  const p0 = item.imageToViewerElementCoordinates(new OpenSeadragon.Point(0, 0));
  const p1 = item.imageToViewerElementCoordinates(new OpenSeadragon.Point(ov.width, 0));
  const s = (p1.x - p0.x) / ov.width;
  const X = (x) => p0.x + x * s, Y = (y) => p0.y + y * s;
  const visible = (x, y, size) => X(x + size) >= 0 && X(x) <= w && Y(y + size) >= 0 && Y(y) <= h;
  let heatDrawn = 0;
  if (ov.heat && el("show-heat").checked) {
    const name = el("output").value, values = ov.heat.outputs[name] || [];
    const vmax = values.reduce((m, v) => (v === null ? m : Math.max(m, Math.abs(v))), 1e-12);
    const size = ov.heat.size, side = Math.max(1, size * s);
    ctx.globalAlpha = Number(el("opacity").value);
    ov.heat.xy.forEach(([x, y], i) => {
      if (values[i] === null || !visible(x, y, size)) return;
      const [r, g, b] = diverging(values[i] / vmax);
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      const x0 = Math.floor(X(x)), y0 = Math.floor(Y(y)); // whole pixels: no seams between tiles
      ctx.fillRect(x0, y0, Math.ceil(X(x) + side) - x0, Math.ceil(Y(y) + side) - y0);
      heatDrawn += 1;
    });
    ctx.globalAlpha = 1;
    legend.push(`<div>${escapeHtml(name)}: contribution, &minus;${vmax.toPrecision(3)} to +${vmax.toPrecision(3)}</div><div class="ramp"></div>`);
  }
  document.body.dataset.heatDrawn = String(heatDrawn);
  if (ov.tiles && el("show-tiles").checked) {
    const size = ov.tiles.size;
    ctx.strokeStyle = "rgb(0,158,115)"; ctx.lineWidth = 1; // the QC picture's kept outline (Okabe-Ito bluish green)
    for (const [x, y] of ov.tiles.xy) if (visible(x, y, size)) ctx.strokeRect(X(x), Y(y), size * s, size * s);
    legend.push(`<div><span class="swatch" style="border:2px solid rgb(0,158,115)"></span>kept tiles (${ov.tiles.xy.length})</div>`);
  }
  const classes = new Map(), counts = new Map();
  for (const [name, features] of Object.entries(state.geo)) {
    if (!state.geoOn[name]) continue;
    for (const f of features) {
      const props = f.properties || {}, cls = (props.classification && props.classification.name) || props.objectType || name;
      const [r, g, b] = qupathColor(props, cls, classes);
      counts.set(cls, [(counts.get(cls) || [0])[0] + 1, [r, g, b]]);
      // the QC layer as the QC picture draws it (qc_style.js); other layers' objects as outlines
      const style = name === "qc" ? qcStyle(props, cls, [r, g, b])
        : { stroke: `rgb(${r},${g},${b})`, width: props.objectType === "annotation" ? 2.5 : 1, dash: [], dashStroke: null, fill: null };
      const geom = f.geometry || {};
      const polys = geom.type === "Polygon" ? [geom.coordinates] : geom.type === "MultiPolygon" ? geom.coordinates : [];
      ctx.beginPath();
      for (const poly of polys) for (const ring of poly) ring.forEach(([x, y], i) => i ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y)));
      if (style.fill) { ctx.fillStyle = style.fill; ctx.fill("evenodd"); }
      ctx.lineWidth = style.width;
      if (style.dashStroke) { ctx.setLineDash([]); ctx.strokeStyle = style.dashStroke; ctx.stroke(); }
      ctx.setLineDash(style.dash); ctx.strokeStyle = style.stroke; ctx.stroke(); ctx.setLineDash([]);
    }
  }
  for (const [cls, [n, [r, g, b]]] of counts) legend.push(`<div><span class="swatch" style="background:rgb(${r},${g},${b})"></span>${escapeHtml(cls)} (${n})</div>`);
  if (el("show-top").checked) {
    ctx.font = "12px system-ui, sans-serif"; ctx.lineWidth = 2.5;
    // the top tiles of the output the heatmap shows (all of them without a heatmap)
    const shown = ov.heat && el("show-heat").checked ? el("output").value : null;
    for (const t of ov.top_tiles) {
      if (shown !== null && t.output !== shown) continue;
      const size = t.size || 0;
      ctx.strokeStyle = t.side === "most" ? "rgb(200,0,0)" : "rgb(0,60,200)";
      ctx.strokeRect(X(t.x), Y(t.y), size * s, size * s);
      ctx.fillStyle = ctx.strokeStyle;
      ctx.fillText(`${shown === null ? t.output + " " : ""}${t.side} #${t.rank}`, X(t.x) + 3, Y(t.y) + 14);
    }
    if (ov.top_tiles.length) legend.push(`<div>top tiles: <span style="color:#c00">most</span> / <span style="color:#03c">least</span></div>`);
  }
  el("legend").innerHTML = legend.join("");
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

if (params.get("opacity") !== null) el("opacity").value = params.get("opacity");
for (const id of ["show-heat", "output", "opacity", "show-tiles", "show-top"]) el(id).addEventListener("input", draw);
window.addEventListener("resize", draw);
loadList().catch((e) => { problem(`could not load the slide list: ${e}`); document.body.dataset.state = "error"; });
