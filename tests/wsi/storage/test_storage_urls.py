"""URLs told from paths, refused when they hold a secret, masked in messages; the CLI keeps them whole;
a remote folder mirrored through fsspec's in-memory filesystem (no server: see test_storage_s3.py for S3).
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from wsi.cli._locations import PathOrUrl
from wsi.core.errors import StorageError
from wsi.storage import Mirror, Url, is_url, location, origin, parse_url, redact


def test_urls_are_told_from_paths() -> None:
    assert is_url("s3://bucket/slides/a.svs") and is_url("gs://b/x") and is_url("https://host/a.svs")
    assert not is_url("slides/a.svs") and not is_url("C:\\slides\\a.svs") and not is_url(Path("s3:/x"))
    assert location("file:///data/a%20b.svs") == Path("/data/a b.svs")  # file:// is a local path
    url = location("S3://bucket/run/tiles/a.h5")
    assert isinstance(url, Url) and url == "s3://bucket/run/tiles/a.h5"
    assert (url.name, url.stem, url.suffix, url.parent) == ("a.h5", "a", ".h5", "s3://bucket/run/tiles")
    assert Url("s3://b/run/") / "tiles/" / "a.h5" == "s3://b/run/tiles/a.h5"
    assert Url("s3://b/run/tiles/a.h5").relative_to("s3://b/run/") == "tiles/a.h5"
    assert origin("s3://b/x") == "s3://b/x"


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLE:wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY@bucket/slides/",
        "https://user:hunter2hunter2@host.example/a.svs",
        "https://host.example/a.svs?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=0123456789abcdef",
        "https://acct.blob.core.windows.net/c/a.svs?sv=2022&sig=c2VjcmV0c2VjcmV0",
    ],
)
def test_a_url_with_a_secret_is_refused_and_never_echoed(url: str) -> None:
    with pytest.raises(StorageError) as err:
        parse_url(url, what="slide")
    text = str(err.value)
    for secret in (
        "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY",
        "hunter2hunter2",
        "0123456789abcdef",
        "c2VjcmV0c2VjcmV0",
    ):
        assert secret not in text
    assert "***" in text and ("credentials" in text or "signed" in text)


def test_redact_masks_credential_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-s3cr3t-s3cr3t")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "tok")  # too short to mask: it would hit ordinary words
    text = redact("SignatureDoesNotMatch: computed with s3cr3t-s3cr3t-s3cr3t for s3://k:v@b/x; tok")
    assert "s3cr3t" not in text and "k:v@" not in text and text.endswith("tok")


def test_the_cli_keeps_a_url_whole_and_checks_paths_as_before(tmp_path: Path) -> None:
    kind = PathOrUrl(exists=True, file_okay=False)
    assert kind.convert("s3://bucket/run/", None, None) == "s3://bucket/run/"  # not s3:/bucket/run
    assert kind.convert(str(tmp_path), None, None) == tmp_path
    with pytest.raises(click.BadParameter, match="does not exist"):
        kind.convert(str(tmp_path / "missing"), None, None)
    with pytest.raises(click.BadParameter, match="holds credentials") as err:
        kind.convert("s3://KEY:SECRETSECRET@bucket/run/", None, None)
    assert "SECRETSECRET" not in str(err.value)


def test_a_mirror_pushes_changes_and_pulls_what_the_remote_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsspec's memory filesystem as the remote: upload under a temporary name then moved, a done file
    last, deletions propagated, a second machine pulls only what exists there."""
    import fsspec

    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "one"))
    url = parse_url("memory://bucket/run")
    mirror = Mirror(url)
    (mirror.local / "qc").mkdir(parents=True)
    (mirror.local / "qc" / "a.png").write_bytes(b"png")
    (mirror.local / "a.h5").write_bytes(b"done")
    assert mirror.push(["qc/a.png", "a.h5"], last=["a.h5"]) == 2
    fs = fsspec.filesystem("memory")
    assert fs.cat("/bucket/run/a.h5") == b"done" and not fs.glob("/bucket/run/.a.h5.tmp-*")
    assert mirror.push(["qc/a.png", "a.h5"], last=["a.h5"]) == 0  # nothing changed: nothing sent
    (mirror.local / "qc" / "a.png").unlink()
    mirror.push(["qc/a.png", "a.h5"])
    assert not fs.exists("/bucket/run/qc/a.png")  # removed here, removed there

    monkeypatch.setenv("WSI_CACHE_DIR", str(tmp_path / "two"))
    other = Mirror(url)
    assert other.local != mirror.local
    assert other.pull_folder() == ["a.h5"] and (other.local / "a.h5").read_bytes() == b"done"
    assert origin(other.local / "a.h5") == "memory://bucket/run/a.h5"
    fs.rm("/bucket/run/a.h5")
    other.pull_folder()
    assert not (other.local / "a.h5").exists()  # gone there: gone here
