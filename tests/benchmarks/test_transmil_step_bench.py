"""benchmarks/transmil_step.py: its "authors' full" column is the authors' Nystrom computation (the
reference in tests/helpers) and ours gives the same logits while inverting the reduced matrix."""

from __future__ import annotations

import pytest
import torch
from mil_baselines_reference import RefTransMIL

from transmil_step import full_model, main, run
from wsi.models import build_model
from wsi.models.baselines import transmil

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_full_column_is_the_authors_model() -> None:
    torch.manual_seed(0)
    ref = RefTransMIL(in_dim=16).eval()
    ours = build_model("transmil", in_dim=16).eval()
    ours.load_state_dict(transmil.from_authors_state_dict(ref.state_dict()))
    full = full_model(ours).eval()
    x = torch.randn(1, 40, 16)
    with torch.no_grad():
        assert (full(x) - ref(x)).abs().max() <= 1e-5
    assert type(ours.layer1.attn).__name__ == "NystromAttention"  # the copy changed, not the model


def test_rows_give_the_reduced_size_equal_logits_and_times(capsys: pytest.CaptureFixture[str]) -> None:
    rows = run([3, 40], in_dim=8, steps=1)
    # 3 tiles: 1 + 2^2 = 5 tokens, 251 padding landmarks -> 6 rows; 40: 1 + 7^2 = 50 tokens -> 51 rows
    assert [(n, reduced) for n, reduced, *_ in rows] == [(3, 6), (40, 51)]
    assert all(full > 0 and ours > 0 and diff <= 1e-5 for _, _, full, ours, diff in rows)
    assert main(["--tiles", "3", "--in-dim", "8", "--steps", "1"]) == 0
    assert "| 3 | 6 | " in capsys.readouterr().out
