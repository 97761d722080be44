"""Long bags in bounded memory: automatic chunking, streaming a bag from chunks, automatic checkpointing.

Memory figures are whole-process peak resident sets (a high-water mark), so each is read in a fresh
interpreter. A 100,000-token bag's input alone (2048-d float32) is 0.82 GB of the 2 GiB budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from wsi.core.errors import ConfigError
from wsi.models.presets import build_model

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ["seqnorm", "softmax", "sima", "gdla"]
TINY = {"dim": 32, "attn_dim": 16, "heads": 4, "mlp_dim": 48, "depth": 2, "in_dim": 24}


def _bag(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, n, 24) float16 features as on disk and (1, n, 2) coordinates on a sparse slide grid."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.randperm(4 * n, generator=g)[:n]
    coords = torch.stack([cells % 90, cells // 90], -1).float()[None] * 112.0
    return torch.randn(1, n, 24, generator=g).half(), coords


def _chunks(x: torch.Tensor, coords: torch.Tensor, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, x.shape[1], size):
        yield x[0, start : start + size], coords[0, start : start + size]


@pytest.mark.parametrize("name", VARIANTS)
def test_a_bag_streamed_in_chunks_gives_the_in_memory_logits(name: str) -> None:
    torch.manual_seed(0)
    m = build_model("vit-wsi", attention=name, pos_encoding=True, **TINY).eval()
    x, coords = _bag(700)
    with torch.no_grad():
        want = m(x, coords_um=coords, max_tokens_per_chunk=10_000)  # one chunk: the plain computation
        for read, chunk in ((97, None), (700, 64), (256, 1000)):
            got = m.logits_from_chunks(_chunks(x, coords, read), n_tiles=700, max_tokens_per_chunk=chunk)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert torch.equal(torch.softmax(got, -1).argmax(-1), torch.softmax(want, -1).argmax(-1))


def test_streaming_refuses_miscounted_or_mixed_chunks() -> None:
    m = build_model("vit-wsi", attention="gdla", **TINY).eval()
    x, coords = _bag(50)
    with pytest.raises(ConfigError, match="held 50 tiles, not n_tiles=60"):
        m.logits_from_chunks(_chunks(x, coords, 20), n_tiles=60)
    with pytest.raises(ConfigError, match="more than n_tiles=40"):
        m.logits_from_chunks(_chunks(x, coords, 20), n_tiles=40)
    mixed = [(x[0, :25], coords[0, :25]), (x[0, 25:], None)]
    with pytest.raises(ConfigError, match="every chunk or with none"):
        m.logits_from_chunks(mixed, n_tiles=50)
    with pytest.raises(ConfigError, match=r"\(B, N, 24\), got \(1, 50, 20\)"):
        m.logits_from_chunks([(x[0, :, :20], coords[0])], n_tiles=50)


@pytest.mark.parametrize("name", ["seqnorm", "gdla"])
def test_long_bags_switch_to_chunks_and_checkpoints_by_themselves(name: str) -> None:
    torch.manual_seed(0)
    auto = build_model("vit-wsi", attention=name, chunk_above_tokens=64, checkpoint_above_tokens=64, **TINY)
    torch.manual_seed(0)
    plain = build_model(
        "vit-wsi", attention=name, chunk_above_tokens=None, checkpoint_above_tokens=None, **TINY
    )
    x, coords = _bag(300)
    x = x.float()
    with torch.no_grad():
        torch.testing.assert_close(
            auto.eval()(x, coords_um=coords), plain.eval()(x, coords_um=coords), atol=1e-5, rtol=0
        )
    assert auto.config.chunk_for(301) and not auto.config.chunk_for(64)
    for model in (auto, plain):
        model.train()(x, coords_um=coords).logsumexp(-1).sum().backward()
    with torch.enable_grad():
        assert auto.config.checkpoint_for(301, training=True) and not plain.config.checkpoint_for(301, True)
    for (k, p), q in zip(auto.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=k)


SCRIPT = """
import json, resource, sys, torch
from wsi.models.presets import build_model
mode = sys.argv[1]
torch.manual_seed(0)
def peak():  # this process's own high-water mark in GiB
    # Not ru_maxrss: Linux carries it across exec, so a child started by a large parent (pytest late in
    # the suite, vfork) reports the parent's size. VmHWM belongs to the new address space alone.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB -> GiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
kw = {"chunk_above_tokens": None} if mode == "plain" else {}
model = build_model("vit-wsi", attention="seqnorm", in_dim=2048, **kw).eval()
x = torch.randn(1, 100_000, 2048)  # float32 input: 0.82 GB of the budget
with torch.no_grad():
    logits = model(x)
print(json.dumps({"peak_gib": peak(), "logits": logits.tolist()}))
"""


def _peak(mode: str) -> dict:
    # A fresh interpreter with a minimal environment, so nothing an earlier test left in os.environ
    # changes what is measured; MALLOC_ARENA_MAX pins glibc's per-thread arenas.
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2",
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _lowest_peak(mode: str, limit_gib: float, tries: int = 2) -> dict:
    """Resident memory is a measurement on a shared machine: a second measurement, not a looser bound,
    absorbs a one-off reading over the bound."""
    runs = [_peak(mode)]
    while runs[-1]["peak_gib"] >= limit_gib and len(runs) < tries:
        runs.append(_peak(mode))
    return min(runs, key=lambda r: r["peak_gib"])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status VmHWM is Linux behaviour")
def test_100k_token_bag_fits_in_2_gib_by_default() -> None:
    """vit-wsi's default forward (no option set) on 100,000 tokens: chunked by itself, under 2 GiB,
    with the logits of the plain pass (which needs more: under 4 GiB)."""
    auto, plain = _lowest_peak("auto", 2.0), _peak("plain")
    assert auto["peak_gib"] < 2.0, auto["peak_gib"]
    assert plain["peak_gib"] < 4.0, plain["peak_gib"]
    torch.testing.assert_close(torch.tensor(auto["logits"]), torch.tensor(plain["logits"]), rtol=0, atol=1e-4)


# A million tiles streamed from a real HDF5 bag through `wsi predict`:
# tests/pipelines/predict/test_predict_stream.py.
