#!/usr/bin/env python3
"""Pack adapter directories into seeds for fuzz/fuzz_adapter.c, whose input
is: u32 little-endian N, N bytes of adapter_config.json, then the bytes of
adapter_model.safetensors.

    python3 scripts/make-adapter-seeds.py BUILD/fixtures

Seeds written to fuzz/corpus/adapter/:
  <kind>            every generated adapter BUILD/fixtures/adapters/<kind>/,
                    cut to one layer (the lowest one it has) and with F32
                    tensors over 16 KiB stored as BF16, so the corpus stays
                    small; the merge still matches every shape of the base
  llama-plain@<base> llama-plain with base_model_name_or_path set to another
                    fixture (BF16, F16, sharded base: the fuzz target picks
                    its base by that field)
  invalid_<case>    every tests/invalid/adapter/<case>/ as it is
Cases whose seed is over 64 KiB are dropped (reported).  Plain python3,
deterministic; the seeds are committed, so run this only when the fixtures
or the invalid cases change.
"""
import json
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
OUT = os.path.join(ROOT, "fuzz", "corpus", "adapter")
MAX_SEED = 64 << 10
BF16_OVER = 16 << 10
LAYER = re.compile(r"\.layers\.(\d+)\.")
OTHER_BASES = ["llama-bf16", "llama-f16", "llama-sharded"]


def pack(config, weights):
    return struct.pack("<I", len(config)) + config + weights


def read_st(data):
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return header, data[8 + n:]


def bf16(raw):
    """F32 bytes -> BF16 bytes, round to nearest even (finite values)."""
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        u += 0x7FFF + ((u >> 16) & 1)
        out += struct.pack("<H", (u >> 16) & 0xFFFF)
    return bytes(out)


def shrink(data):
    """Keep tensors of the lowest layer (and those outside layers)."""
    header, body = read_st(data)
    meta = header.pop("__metadata__", None)
    layers = [int(m.group(1)) for m in map(LAYER.search, header) if m]
    keep = min(layers) if layers else None
    out_header, out_body = {}, b""
    if meta is not None:
        out_header["__metadata__"] = meta
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        m = LAYER.search(name)
        if m and int(m.group(1)) != keep:
            continue
        begin, end = t["data_offsets"]
        raw, dtype = body[begin:end], t["dtype"]
        if dtype == "F32" and len(raw) > BF16_OVER:
            raw, dtype = bf16(raw), "BF16"
        out_header[name] = {"dtype": dtype, "shape": t["shape"],
                            "data_offsets": [len(out_body),
                                             len(out_body) + len(raw)]}
        out_body += raw
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + out_body


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make-adapter-seeds.py BUILD/fixtures")
    adapters = os.path.join(sys.argv[1], "adapters")
    seeds = {}
    for kind in sorted(os.listdir(adapters)):
        d = os.path.join(adapters, kind)
        cfg = read(os.path.join(d, "adapter_config.json"))
        st = shrink(read(os.path.join(d, "adapter_model.safetensors")))
        seeds[kind] = pack(cfg, st)
        if kind == "llama-plain":
            for base in OTHER_BASES:
                c = json.loads(cfg)
                c["base_model_name_or_path"] = base
                seeds["llama-plain@" + base] = pack(
                    json.dumps(c, indent=2).encode(), st)
    invalid = os.path.join(ROOT, "tests", "invalid", "adapter")
    for case in sorted(os.listdir(invalid)):
        d = os.path.join(invalid, case)
        cfg = os.path.join(d, "adapter_config.json")
        st = os.path.join(d, "adapter_model.safetensors")
        seeds["invalid_" + case] = pack(
            read(cfg) if os.path.exists(cfg) else b"",
            read(st) if os.path.exists(st) else b"")
    os.makedirs(OUT, exist_ok=True)
    count = total = 0
    for name, data in sorted(seeds.items()):
        if len(data) > MAX_SEED:
            print("dropped %s (%d bytes)" % (name, len(data)))
            continue
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        count += 1
        total += len(data)
    print("%d seeds, %d bytes in %s" % (count, total, OUT))


if __name__ == "__main__":
    main()
