"""Weights from the Hugging Face cache, offline: found where `hf download` (or `huggingface-cli download`)
put them, never downloaded at run time.

`--weights` left out for a model published on the Hugging Face Hub, or given as `hf:ORG/REPO` (optionally
`hf:ORG/REPO/FILE`, `@REVISION`), is looked up with huggingface_hub's own cache lookup
(`try_to_load_from_cache`: refs/<revision> -> snapshots/<commit>/<file>, the symlinks into blobs/), in
the cache folder huggingface_hub itself would use: HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else
HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (the order of
huggingface_hub/constants.py, read here at call time so a changed environment counts). Nothing touches the
network: the lookup reads folders, and `offline()` sets HF_HUB_OFFLINE=1 for the process, so no library
(timm, transformers) fetches anything either. The checks after it (sha256, every tensor's name and shape)
are the same as for a file given by path. Absent weights give the exact download command, the licence and
the page where it is accepted.

    hub_cache() -> Path
    cache_problem() -> str                       the cache placed on a file: the variable named ("" when fine)
    repo_of(text) -> "ORG/REPO" | None          from a recipe's source or a weights page
    parse_ref("hf:ORG/REPO[/FILE][@REV]") -> HubRef
    cached_file(repo, files, revision=None) -> Path | None
    hub_weights(weights, *, repo, files, what, licence, page) -> Path | None
    is_cached(repo, files) -> bool               what `wsi encoders` marks as present
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wsi.core.errors import WeightsError
from wsi.storage.cache import local_copy
from wsi.storage.urls import is_url, parse_url

PREFIX = "hf:"
_REPO_IN_TEXT = re.compile(r"huggingface\.co/([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)")
_REF = re.compile(r"^hf:(?P<repo>[^/@]+/[^/@]+)(?:/(?P<file>[^@]+))?(?:@(?P<rev>[^@]+))?$")
#: one part of ORG/REPO as the Hub allows it (huggingface_hub's validate_repo_id: letters, digits, '-',
#: '_', '.', no '--' or '..', not starting or ending with '-' or '.', at most 96 characters)
_REPO_PART = re.compile(r"^[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?$")
#: one folder or file name of a path inside a repository, or a revision (a branch, tag or commit)
_FILE_PART = re.compile(r"^[\w][\w.+ -]{0,254}$")
_REVISION = re.compile(r"^[\w][\w.+/-]{0,254}$")


@dataclass(frozen=True)
class HubRef:
    repo: str
    filename: str | None = None
    revision: str | None = None


def offline() -> None:
    """Make this process (and the processes it starts) refuse any Hugging Face download."""
    os.environ["HF_HUB_OFFLINE"] = "1"


def hub_cache() -> Path:
    """The Hugging Face cache folder, by huggingface_hub's own rules, from the environment as it is now."""
    env = os.environ
    given = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if given:
        return Path(os.path.expandvars(given)).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def cache_problem() -> str:
    """Why the Hugging Face cache cannot hold anything ("" when it can): its folder, or one above it, is
    a file (or a pipe, a device), naming the variable that placed it there; a missing folder is fine."""
    env = os.environ
    cache = hub_cache()
    blocker = next((p for p in (cache, *cache.parents) if p.exists() or p.is_symlink()), None)
    if blocker is None or blocker.is_dir():
        return ""
    names = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")
    variable = next((f"{n}={env[n]!r}" for n in names if env.get(n)), "HOME")
    where = "is" if blocker == cache else f"lies below {blocker}, which is"
    return (
        f"the Hugging Face cache {cache} (from {variable}) {where} not a folder; point that variable at "
        "the folder `hf download` filled, or unset it"
    )


def repo_of(text: str | None) -> str | None:
    """The ORG/REPO a recipe's source or a weights page names on huggingface.co, else None."""
    m = _REPO_IN_TEXT.search(text or "")
    return m.group(1).removesuffix(".git") if m else None


def is_ref(weights: object) -> bool:
    return isinstance(weights, str | os.PathLike) and os.fspath(weights).startswith(PREFIX)


def parse_ref(text: str, *, option: str = "--weights") -> HubRef:
    """`hf:ORG/REPO[/FILE][@REVISION]`, every part checked before huggingface_hub sees it: a name with
    `..`, an absolute or empty path part, or characters the Hub does not allow is a WeightsError."""
    m = _REF.match(text.strip())
    shown = repr(text) if text.isprintable() else ascii(text)
    usage = (
        "write hf:ORG/REPO (e.g. hf:MahmoodLab/UNI2-h), optionally hf:ORG/REPO/FILE or @REVISION, with "
        "letters, digits, '-', '_' and '.' (no '..')"
    )
    if not m:
        raise WeightsError(f"{option} {shown}: not a Hugging Face reference; {usage}")
    repo, file, rev = m.group("repo"), m.group("file"), m.group("rev")
    bad = [p for p in repo.split("/") if not _REPO_PART.match(p) or ".." in p or "--" in p]
    if file is not None:
        bad += [p for p in file.split("/") if p in ("", ".", "..") or not _FILE_PART.match(p)]
    if rev is not None and (not _REVISION.match(rev) or ".." in rev.split("/") or "//" in rev):
        bad.append(rev)
    if bad:
        raise WeightsError(
            f"{option} {shown}: {', '.join(map(repr, dict.fromkeys(bad)))} is not allowed in a Hub name; "
            f"{usage}"
        )
    return HubRef(repo, file, rev)


def cached_file(repo: str, files: Sequence[str], revision: str | None = None) -> Path | None:
    """The first of `files` that the cache holds for `repo` at `revision` (default: main), else None."""
    from huggingface_hub import try_to_load_from_cache

    cache = hub_cache()
    for name in files:
        found = try_to_load_from_cache(repo, name, cache_dir=cache, revision=revision)
        if isinstance(found, str) and Path(found).is_file():
            check_inside_cache(Path(found), repo)
            return Path(found)
    return None


def repo_folder(repo: str) -> Path:
    """The cache's folder of a model repository (huggingface_hub's `models--ORG--REPO`)."""
    return hub_cache() / ("models--" + repo.replace("/", "--"))


def check_inside_cache(path: Path, repo: str) -> None:
    """WeightsError unless `path` (a snapshot file, or a folder's files) resolves inside the repository's
    cache folder: a snapshot link that points elsewhere (another file of the machine) is never read, and
    nothing of what it points at is shown."""
    home = repo_folder(repo).resolve()
    for item in [*path.iterdir()] if path.is_dir() else [path]:
        target = item.resolve()
        if target != home and home not in target.parents:
            raise WeightsError(
                f"{item}: this Hugging Face cache file of {repo} links outside the cache folder {home}, so "
                "it is not read; remove the repository from the cache (hf cache delete, or delete the "
                "folder)"
                f" and download it again ({download_command(repo, item.name)})"
            )


def is_cached(repo: str | None, files: Sequence[str]) -> bool:
    return repo is not None and cached_file(repo, files) is not None


def download_command(repo: str, filename: str) -> str:
    return f"hf download {repo} {filename}"


def missing_message(what: str, repo: str, files: Sequence[str], licence: str, page: str) -> str:
    """What to do when the weights of `what` are not in the cache: the licence, the page, the command."""
    cmd = download_command(repo, files[0])
    old = f"huggingface-cli download {repo} {files[0]}"
    return (
        f"{what}: weights not in the Hugging Face cache ({hub_cache()}; HF_HOME or HF_HUB_CACHE move it), "
        f"looked for {', '.join(files)} of {repo}; they are never downloaded at run time. Accept the licence "
        f"({licence}) at {page}, log in once (hf auth login), then run:  {cmd}  "
        f"(with huggingface_hub before 1.0: {old}); or give --weights FILE"
    )


def hub_weights(
    weights: str | os.PathLike[str] | None,
    *,
    repo: str | None,
    files: Sequence[str],
    what: str,
    licence: str = "see its page",
    page: str = "",
    option: str = "--weights",
) -> Path | None:
    """The local weights file for `weights`: a path as given, a URL's local copy; `hf:ORG/REPO[/FILE]`
    or, with `weights` None, the model's own repository (`repo`) found in the cache. None when `weights`
    is None and the model is not on the Hub (the caller says what to give). WeightsError naming the
    command when a Hub model's file is not in the cache."""
    if weights is not None and is_url(weights):  # s3://models/x.pth: a local copy, checked the same way
        return local_copy(parse_url(os.fspath(weights), what="weights file"), why="weights are read locally")
    if weights is not None and not is_ref(weights):
        return Path(weights)
    if weights is None and repo is None:
        return None
    ref = parse_ref(os.fspath(weights), option=option) if weights is not None else HubRef(str(repo))
    wanted = (ref.filename,) if ref.filename else tuple(files)
    problem = cache_problem()
    if problem:  # not "not in the cache": the cache itself is misplaced
        raise WeightsError(f"{what}: {problem}")
    found = cached_file(ref.repo, wanted, ref.revision)
    if found is None:
        shown = page if page and repo == ref.repo else f"https://huggingface.co/{ref.repo}"
        raise WeightsError(missing_message(what, ref.repo, wanted, licence, shown))
    return found


__all__ = [
    "PREFIX",
    "HubRef",
    "cache_problem",
    "cached_file",
    "check_inside_cache",
    "download_command",
    "hub_cache",
    "hub_weights",
    "is_cached",
    "is_ref",
    "missing_message",
    "offline",
    "parse_ref",
    "repo_folder",
    "repo_of",
]  # fmt: skip
