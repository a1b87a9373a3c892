"""Protobuf wire format by hand, to build request bytes no generated client would send."""

from __future__ import annotations

BAD_UTF8 = (b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"ab\x80", b"\xe2\x82")
"""Not UTF-8: stray bytes, a UTF-16 surrogate, overlong NUL, past U+10FFFF, a lone
continuation byte, a truncated sequence."""


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a base-128 varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    """Field ``field`` as wire type 2 (a string, bytes, a message or a packed repeated field)."""
    return tag(field, 2) + varint(len(payload)) + payload
