"""Shared fixtures. Real data lives in ../shared/data; tests that need it skip when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real test data not found at {SHARED_DATA} (see DEVELOPERS.md)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _few_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep BLAS/torch from oversubscribing the two CI cores when tests start worker processes."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
