"""Slide ids: Unicode kept, only path-unsafe characters made safe, a stable hash where that changed them."""

from __future__ import annotations

import unicodedata

import pytest

from wsi.core.errors import SlideIdError, WsiError
from wsi.core.files import case_collisions, sanitize_slide_id, short_hash, slide_id_from_path


def test_plain_ids_are_unchanged() -> None:
    for name in ("slide-1", "TCGA-AB-1234-01Z-00-DX1.5C3A", "CMU-1-Small-Region", "a_b.c"):
        assert sanitize_slide_id(name) == name


def test_unicode_letters_are_kept() -> None:
    assert sanitize_slide_id("标本") == "标本"
    assert slide_id_from_path("/data/标本.svs") == "标本"
    assert slide_id_from_path("/data/Präparat.ome.tiff") == "Präparat"


def test_nfc_and_nfd_spellings_are_one_id() -> None:
    nfd = unicodedata.normalize("NFD", "Präparat")
    assert nfd != "Präparat" and sanitize_slide_id(nfd) == sanitize_slide_id("Präparat") == "Präparat"


def test_ids_made_safe_do_not_collide() -> None:
    a, o = sanitize_slide_id("Präparat ä"), sanitize_slide_id("Präparat ö")
    assert a != o
    assert a.startswith("Präparat_ä-") and o.startswith("Präparat_ö-")
    # made safe -> hashed, so the safe spelling of one name never equals another name's own id
    assert sanitize_slide_id("slide 1") != sanitize_slide_id("slide_1") == "slide_1"


def test_hash_is_stable_across_runs() -> None:
    # the literal pins the id across Python versions and machines: resume depends on it
    assert short_hash("slide 1") == "759c20"
    assert sanitize_slide_id("slide 1") == "slide_1-759c20"


@pytest.mark.parametrize(
    "name", ["../etc/passwd", "a/b", "a\\b", "x:y*z?", 'q"<>|', "tab\there", "..", "nul\x00"]
)
def test_path_unsafe_characters_never_survive(name: str) -> None:
    try:
        out = sanitize_slide_id(name)
    except SlideIdError:
        return
    assert not any(c in out for c in '/\\:*?"<>|\t\x00') and ".." not in out and not out.startswith(".")


def test_unusable_ids_raise_a_user_error() -> None:
    for name in ("...", "   ", "//", "-_-"):
        with pytest.raises(SlideIdError, match="slide_id column") as info:
            sanitize_slide_id(name)
        assert isinstance(info.value, WsiError)


def test_long_and_reserved_names_are_usable_file_names() -> None:
    long = sanitize_slide_id("ä" * 300)
    assert len(long.encode("utf-8")) <= 200
    assert sanitize_slide_id("CON").upper() != "CON"


def test_case_collisions_are_found() -> None:
    got = case_collisions(["Slide1", "slide1", "other", "SLIDE1", "other"])
    assert got == {"slide1": ["Slide1", "slide1", "SLIDE1"]}
    assert case_collisions(["a", "b"]) == {}
