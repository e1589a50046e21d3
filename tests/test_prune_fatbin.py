"""tools/prune_fatbin.py: the device code of the archs not kept is zeroed in place, headers and
every offset kept (a fatbin laid out as CUDA writes it: a header, then entries each with its
own header: kind, header size, payload size, arch at byte 28)."""

from __future__ import annotations

import struct

from tools.prune_fatbin import MAGIC, prune


def entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0, len(header), len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def test_only_the_kept_arch_survives():
    entries = entry(2, 90, b"\x11" * 32) + entry(2, 100, b"\x22" * 48) + entry(1, 80, b"\x33" * 16)
    fat = struct.pack("<IHHQ", MAGIC, 1, 16, len(entries)) + entries
    data = bytearray(b"host" + fat + b"tail")
    found = prune(data, 4, len(fat), {90})
    assert found == {"kept": 32, "zeroed": 64}
    assert b"\x11" * 32 in data and b"\x22" not in data and b"\x33" not in data
    assert len(data) == 4 + len(fat) + 4 and data.endswith(b"tail")
