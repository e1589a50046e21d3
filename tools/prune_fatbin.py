"""Zero the device code of every GPU arch but the kept ones in a shared library's .nv_fatbin
(section and entry headers untouched, so every offset stays): the library then compresses to
about the size of its host code and the kept archs' cubins. For carrying vLLM's 88 MiB
_C_stable_libtorch.abi3.so to a GPU machine whose calls carry 64 MiB:

    python3 tools/prune_fatbin.py SO OUT --keep 90      # sm_90 SASS and compute_90 PTX only

The CUDA runtime loads the entry of the device's arch; on any other arch the pruned library
fails to load its kernels (the row says so). Not a build `kernels unpack` checks (its sha256
is not the wheel's): pass its folder as the backend's `lib`."""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys

MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "elf"}


def fatbin_section(path: str) -> tuple[int, int]:
    out = subprocess.run(["readelf", "-S", "--wide", path], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if ".nv_fatbin" in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    raise SystemExit(f"{path}: no .nv_fatbin section")


def prune(data: bytearray, start: int, size: int, keep: set[int]) -> dict[str, int]:
    """Zero the payload of each entry whose arch is not kept; bytes kept/zeroed by kind."""
    found = {"kept": 0, "zeroed": 0}
    pos, end = start, start + size
    while pos + 16 <= end:
        magic, _, header, fat = struct.unpack_from("<IHHQ", data, pos)
        if magic != MAGIC:
            pos += 8
            continue
        entry, stop = pos + header, pos + header + fat
        while entry < stop:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + 28)
            body = entry + entry_header
            if kind in KINDS and arch not in keep:
                data[body : body + payload] = bytes(payload)
                found["zeroed"] += payload
            else:
                found["kept"] += payload
            entry = body + payload
        pos = stop
    return found


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("so")
    p.add_argument("out")
    p.add_argument("--keep", type=int, action="append", required=True, help="sm number: 90")
    args = p.parse_args(argv)
    with open(args.so, "rb") as f:
        data = bytearray(f.read())
    start, size = fatbin_section(args.so)
    found = prune(data, start, size, set(args.keep))
    with open(args.out, "wb") as f:
        f.write(data)
    mib = {k: round(v / 2**20, 1) for k, v in found.items()}
    print(f"{args.out}: device code kept {mib['kept']} MiB, zeroed {mib['zeroed']} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
