"""JPEG stream completion: a TIFF's JPEG tile as a stream any decoder (nvjpeg, libjpeg-turbo) reads.

TIFF JPEG tiles are often abbreviated: the quantisation and Huffman tables live once in the page's
JPEGTables tag, not in each tile. And Aperio writes RGB (not YCbCr) JPEG tiles with component ids
0, 1, 2 and no JFIF/Adobe marker, which decoders take for YCbCr. `complete_jpeg` fixes both.
"""

from __future__ import annotations

SOI = b"\xff\xd8"  # start-of-image marker every JPEG stream begins with
#: APP14 "Adobe" segment with transform 0: the three components are R, G, B (no YCbCr conversion)
_ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
_APP0 = b"\xff\xe0"
_JFIF = b"JFIF\x00"


def complete_jpeg(tile: bytes, tables: bytes | None, rgb: bool) -> bytes:
    """A TIFF JPEG tile as a stand-alone JPEG stream.

    tables: the JPEGTables tag (SOI, DQT/DHT segments, EOI) of an abbreviated stream, spliced in after the
    tile's SOI. rgb: photometric RGB (not YCbCr): an Adobe APP14 marker with transform 0 is put first.
    """
    body = tile[2:]
    head = SOI
    if rgb:
        head += _ADOBE_RGB
        if body[:2] == _APP0 and body[4:9] == _JFIF:  # JFIF would mean YCbCr to decoders
            body = body[2 + int.from_bytes(body[2:4], "big") :]
    if tables and len(tables) > 4:
        head += tables[2:-2]  # strip the tables' own SOI and EOI
    return head + body
