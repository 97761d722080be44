"""Shared fixtures. Real data lives in ../shared/data; tests that need it skip when it is absent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from wsi.synthetic import SampleSlide

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs one worker per core), each worker keeps torch on one thread:
    N workers x N threads would oversubscribe the cores and run slower than one process."""
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `heavy` and `slow` tests first (a stable sort, the same in every worker): with one worker per
    core, a minutes-long test started last would leave the other cores idle while it finishes."""
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in ("heavy", "slow")))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real test data not found at {SHARED_DATA} (see DEVELOPERS.md)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _few_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep BLAS/torch from oversubscribing the two CI cores when tests start worker processes."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch in this process on one thread (tiny models gain nothing from more, and two tests' threads
    would fight over the two CI cores); restored afterwards. Use with `pytest.mark.usefixtures`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------- generated sample slides
@pytest.fixture(scope="session")
def make_slide(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., SampleSlide]:
    """Factory: `make_slide(**kwargs) -> wsi.synthetic.SampleSlide`, kwargs as `write_sample_slide`.

    Slides are written once per session into a temporary folder and shared: the same name and kwargs
    return the same file, so treat it as read-only (copy it before damaging it). `name=` picks the file
    name, which is the slide id tests expect: always `<name>.svs` (in a folder of its own when that name
    was used for other settings); two names with the same settings are two files.
    """
    from wsi.synthetic import write_sample_slide

    folder = tmp_path_factory.mktemp("sample-slides")
    made: dict[str, SampleSlide] = {}

    def factory(name: str | None = None, **kwargs: Any) -> SampleSlide:
        key = repr((name, sorted(kwargs.items())))
        if key not in made:
            path = folder / f"{name or 'slide'}.svs"
            if path.exists():  # the name is taken by a slide with other settings: same name, own folder
                path = folder / f"{len(made):03d}" / path.name
                path.parent.mkdir()
            made[key] = write_sample_slide(path, **kwargs)
        return made[key]

    return factory


@pytest.fixture(scope="session")
def sample_slide(make_slide: Callable[..., SampleSlide]) -> SampleSlide:
    """A 3000 x 3000 px slide at 0.5 um/px (1.5 x 1.5 mm), 5 levels, 256 px JPEG tiles: two tissue boxes,
    blank background around them and one blurred box inside the first (see its `.tissue_boxes_um`,
    `.blur_boxes_um`). Returns `wsi.synthetic.SampleSlide`."""
    return make_slide(name="sample", size_um=1500.0, mpp=0.5, seed=0)
