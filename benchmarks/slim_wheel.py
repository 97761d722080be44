"""Rewrite a wheel with only the files a run needs, so the wheels sent to a lent GPU machine fit its carry
limit (64 MiB in all; docs/benchmarks.md "GPU suite").

nvImageCodec's wheel (25 MB) holds its binding for nine Python versions and decoders for JPEG 2000, TIFF
and more; the device decoder needs one binding, the core library and the JPEG extensions (about 6 MB).
The new wheel keeps the dist-info (RECORD rewritten for the files kept) and the same file name.

    python benchmarks/slim_wheel.py .whl/nvidia_nvimgcodec_cu13-*.whl --python cp312 \
        --keep 'nvidia/nvimgcodec/*.py' --keep 'nvidia/nvimgcodec/libnvimgcodec.so*' \
        --keep 'nvidia/nvimgcodec/nvimgcodec_impl.cpython-312-*' \
        --keep 'nvidia/nvimgcodec/extensions/libnvjpeg_ext*' \
        --keep 'nvidia/nvimgcodec/extensions/libjpeg_turbo_ext*'
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import zipfile
from pathlib import Path


def slim(wheel: Path, keep: list[str], out: Path) -> tuple[int, int]:
    """Write `out` with the files of `wheel` matching `keep` (and its dist-info); (files kept, bytes)."""
    with zipfile.ZipFile(wheel) as src:
        names = [n for n in src.namelist() if ".dist-info/" in n or any(fnmatch.fnmatch(n, k) for k in keep)]
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        files = {n: src.read(n) for n in names if n != record}
    lines = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    lines.append(f"{record},,")
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for name, data in files.items():
            dst.writestr(name, data)
        dst.writestr(record, "\n".join(lines) + "\n")
    tmp.replace(out)
    return len(files), out.stat().st_size


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--keep", action="append", required=True, help="glob of the paths to keep (repeat)")
    ap.add_argument("--out", type=Path, default=None, help="[the wheel itself, rewritten]")
    ap.add_argument("--python", default="", help="(for the message only) the Python the binding is for")
    args = ap.parse_args(argv)
    before = args.wheel.stat().st_size
    n, size = slim(args.wheel, args.keep, args.out or args.wheel)
    out = args.out or args.wheel
    print(f"{out}: {n} files, {size / 1e6:.1f} MB (was {before / 1e6:.1f} MB) {args.python}".rstrip())


if __name__ == "__main__":
    main()
