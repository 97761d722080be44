"""What `wsi encoders` says about a model's weights: in the Hugging Face cache or not, and the commands."""

from __future__ import annotations


def weights_state(repo: str | None, files: tuple[str, ...]) -> str:
    """The `weights` column: cached, - (on the Hub, not in the cache), --weights (not on the Hub)."""
    from wsi.storage.hf import is_cached

    if repo is None:
        return "--weights"
    return "cached" if is_cached(repo, files) else "-"


def weights_lines(run: str, repo: str | None, files: tuple[str, ...]) -> list[str]:
    """Where this machine has the weights, or the command that puts them where they are found; `run` is
    the command that uses them, without --weights."""
    from wsi.storage.hf import cached_file, download_command, hub_cache

    if repo is None:
        return [f"  command:   {run} --weights /path/{files[0]}"]
    found = cached_file(repo, files)
    by_path = f"             {run} --weights /path/{files[0]}"
    if found is not None:
        return [f"  cached:    {found}", f"  command:   {run}    (from the cache; or --weights hf:{repo})",
                by_path]  # fmt: skip
    return [
        f"  cached:    no ({hub_cache()}); accept the licence at https://huggingface.co/{repo}, then",
        f"             {download_command(repo, files[0])}",
        f"  command:   {run}    (then from the cache, offline)",
        by_path,
    ]
