#!/usr/bin/env python3
"""Generate the invalid-input suites tests/invalid/safetensors/ and
tests/invalid/index/ (one folder per case: the bad file(s) and `expect`,
a substring the reader's error message must contain).

Plain python3, no numpy.  Output is deterministic; the generated files are
committed, so run this only when adding or changing a case:
    python3 scripts/make-invalid-safetensors.py
Only the case folders named below are rewritten; other folders are left.
"""
import json
import os
import shutil
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                    "invalid")


def st_bytes(header, data=b"", n=None, pad=True):
    """A safetensors file: header is a str/bytes (JSON text) or a dict."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad:
        header += b" " * (-len(header) % 8)
    if n is None:
        n = len(header)
    return struct.pack("<Q", n) + header + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def good_file(tensors):
    """Valid file from [(name, dtype, shape)] of F32/U8 tensors, zeros."""
    size = {"F32": 4, "U8": 1, "F16": 2, "BF16": 2}
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        n = size[dtype]
        for d in shape:
            n *= d
        hdr[name] = t(dtype, shape, off, off + n)
        off += n
    return st_bytes(hdr, b"\0" * off)


W4 = t("F32", [1], 0, 4)  # one float, the usual filler tensor

SAFETENSORS = {
    "file_too_short": (b"\x10\0\0\0\0", "expected at least 8"),
    "header_too_large": (st_bytes("{}", n=100_000_001), "exceeds the limit"),
    "header_past_eof": (st_bytes("{}", n=1000), "runs past the end"),
    "header_empty": (st_bytes(b"", pad=False), "invalid JSON"),
    "invalid_utf8": (st_bytes(b'{"w\xff":' + json.dumps(W4).encode() + b"}",
                              b"\0" * 4), "invalid UTF-8"),
    "overlong_utf8": (st_bytes(b'{"\xc0\xaf":' + json.dumps(W4).encode() + b"}",
                               b"\0" * 4), "invalid UTF-8"),
    "surrogate_utf8": (st_bytes(b'{"\xed\xa0\x80":' + json.dumps(W4).encode() +
                                b"}", b"\0" * 4), "invalid UTF-8"),
    "invalid_json_trailing_comma": (st_bytes('{"w":%s,}' % json.dumps(W4),
                                             b"\0" * 4), "invalid JSON at line 1"),
    "invalid_json_truncated": (st_bytes('{"w":{"dtype":"F32"', b"\0" * 4),
                               "invalid JSON"),
    "top_level_array": (st_bytes("[1, 2]"), "expected a JSON object"),
    "header_not_brace": (st_bytes(' {"w":%s}' % json.dumps(W4), b"\0" * 4),
                         "expected '{'"),
    "duplicate_tensor": (st_bytes('{"w":%s,"w":%s}' % (json.dumps(W4),
                                                      json.dumps(W4)),
                                  b"\0" * 4), "duplicate key 'w'"),
    "duplicate_field": (st_bytes('{"w":{"dtype":"F32","dtype":"F16","shape":[1],'
                                 '"data_offsets":[0,4]}}', b"\0" * 4),
                        "duplicate key 'dtype'"),
    "duplicate_metadata_key": (st_bytes('{"__metadata__":{"format":"pt",'
                                        '"format":"np"},"w":%s}' % json.dumps(W4),
                                        b"\0" * 4), "duplicate key 'format'"),
    "unknown_dtype": (st_bytes({"w": t("F17", [1], 0, 4)}, b"\0" * 4),
                      "unknown dtype 'F17'"),
    "unsupported_dtype": (st_bytes({"w": t("C64", [1], 0, 8)}, b"\0" * 8),
                          "dtype 'C64' is not supported"),
    "dtype_not_string": (st_bytes({"w": t(4, [1], 0, 4)}, b"\0" * 4),
                         "dtype is an integer"),
    "shape_negative": (st_bytes({"w": t("F32", [-1], 0, 4)}, b"\0" * 4),
                       "shape[0] is negative"),
    "shape_not_list": (st_bytes({"w": t("F32", 1, 0, 4)}, b"\0" * 4),
                       "shape is an integer"),
    "shape_real": (st_bytes('{"w":{"dtype":"F32","shape":[1.0],'
                            '"data_offsets":[0,4]}}', b"\0" * 4),
                   "shape[0] is a real number"),
    "shape_too_big_integer": (st_bytes('{"w":{"dtype":"U8","shape":'
                                       '[0,99999999999999999999],'
                                       '"data_offsets":[0,0]}}'),
                              "too big integer"),
    "too_many_dims": (st_bytes({"w": t("F32", [1] * 9, 0, 4)}, b"\0" * 4),
                      "at most 8"),
    "shape_overflow": (st_bytes({"w": t("F32", [2**62, 8], 0, 4)}, b"\0" * 4),
                       "overflows 64 bits"),
    "size_overflow_element": (st_bytes({"w": t("F32", [2**62], 0, 4)},
                                       b"\0" * 4), "x element size"),
    "size_mismatch": (st_bytes({"w": t("F32", [2], 0, 4)}, b"\0" * 4),
                      "span 4 bytes but shape x F32 needs 8"),
    "offsets_begin_after_end": (st_bytes({"w": t("U8", [0], 4, 0)}, b"\0" * 4),
                                "begin > end"),
    "offsets_three_values": (st_bytes('{"w":{"dtype":"F32","shape":[1],'
                                      '"data_offsets":[0,4,8]}}', b"\0" * 4),
                             "data_offsets must be [begin, end]"),
    "offsets_negative": (st_bytes({"w": t("U8", [4], -4, 0)}, b"\0" * 4),
                         "data_offsets must be [begin, end]"),
    "offsets_gap": (st_bytes({"a": t("F32", [1], 0, 4),
                              "b": t("F32", [1], 8, 12)}, b"\0" * 12),
                    "gap of 4 bytes before tensor 'b'"),
    "offsets_gap_at_start": (st_bytes({"a": t("F32", [1], 4, 8)}, b"\0" * 8),
                             "gap of 4 bytes before tensor 'a'"),
    "offsets_overlap": (st_bytes({"a": t("F32", [2], 0, 8),
                                  "b": t("F32", [2], 4, 12)}, b"\0" * 12),
                        "overlapping 'a'"),
    "offsets_same_range": (st_bytes({"a": t("F32", [1], 0, 4),
                                     "b": t("F32", [1], 0, 4)}, b"\0" * 4),
                           "overlapping 'a'"),
    "trailing_bytes": (st_bytes({"w": W4}, b"\0" * 7), "3 trailing bytes"),
    "data_truncated": (st_bytes({"w": t("F32", [4], 0, 16)}, b"\0" * 10),
                       "past the end of the data buffer"),
    "metadata_value_not_string": (st_bytes('{"__metadata__":{"format":"pt",'
                                           '"step":100},"w":%s}' % json.dumps(W4),
                                           b"\0" * 4),
                                  "value for 'step' is an integer"),
    "metadata_not_object": (st_bytes('{"__metadata__":["pt"],"w":%s}' %
                                     json.dumps(W4), b"\0" * 4),
                            "__metadata__ is an array"),
    "entry_extra_key": (st_bytes('{"w":{"dtype":"F32","shape":[1],'
                                 '"data_offsets":[0,4],"strides":[1]}}',
                                 b"\0" * 4), "unexpected key 'strides'"),
    "entry_missing_offsets": (st_bytes('{"w":{"dtype":"F32","shape":[1]}}',
                                       b"\0" * 4), "has no 'data_offsets'"),
    "entry_not_object": (st_bytes('{"w":[1,2]}'), "tensor entry is an array"),
}

SH1 = "model-00001-of-00002.safetensors"
SH2 = "model-00002-of-00002.safetensors"


def index(weight_map, total=None, raw=None):
    if raw is not None:
        return raw.encode("utf-8")
    doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    if total is None:
        del doc["metadata"]
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


A = good_file([("a", "F32", [2])])      # 8 tensor bytes
B = good_file([("b", "F32", [1])])      # 4 tensor bytes
AB = good_file([("a", "F32", [2]), ("b", "F32", [1])])
IDX = "model.safetensors.index.json"

INDEX = {
    "invalid_json": ({IDX: index(None, raw='{"weight_map": {"a": "x"')},
                     "invalid JSON"),
    "duplicate_tensor": ({IDX: index(None, raw='{"weight_map": {"a": "%s", '
                                          '"a": "%s"}}' % (SH1, SH2)),
                          SH1: A, SH2: B}, "duplicate key 'a'"),
    "top_level_array": ({IDX: index(None, raw='[]')}, "expected a JSON object"),
    "no_weight_map": ({IDX: index(None, raw='{"metadata": {}}')},
                      "no \"weight_map\""),
    "weight_map_not_object": ({IDX: index(None, raw='{"weight_map": []}')},
                              "weight_map is not an object"),
    "weight_map_empty": ({IDX: index({})}, "weight_map is empty"),
    "shard_value_not_string": ({IDX: index({"a": 1})}, "is not a string"),
    "shard_escapes_dir": ({IDX: index({"a": "../" + SH1})},
                          "must not escape"),
    "shard_absolute_path": ({IDX: index({"a": "/tmp/" + SH1})},
                            "must not escape"),
    "shard_not_safetensors": ({IDX: index({"a": "config.json"})},
                              "ending in .safetensors"),
    "shard_missing": ({IDX: index({"a": SH1, "b": SH2}), SH1: A},
                      "does not exist"),
    "shard_invalid": ({IDX: index({"a": SH1, "b": SH2}), SH1: A,
                       SH2: SAFETENSORS["offsets_gap"][0]},
                      "gap of 4 bytes"),
    "tensor_not_in_shard": ({IDX: index({"a": SH1, "b": SH1}), SH1: A, SH2: B},
                            "which has no such tensor"),
    "tensor_missing_from_map": ({IDX: index({"a": SH1}), SH1: AB},
                                "missing from the index weight_map"),
    "tensor_in_two_shards": ({IDX: index({"a": SH1, "b": SH2}), SH1: AB,
                              SH2: B}, "appears in two shards"),
    "total_size_mismatch": ({IDX: index({"a": SH1, "b": SH2}, total=13),
                             SH1: A, SH2: B}, "total_size is 13"),
    "total_size_negative": ({IDX: index({"a": SH1}, total=-1), SH1: A},
                            "non-negative integer"),
    "metadata_not_object": ({IDX: index(None, raw='{"metadata": 12, '
                                        '"weight_map": {"a": "%s"}}' % SH1),
                             SH1: A}, "metadata is not an object"),
}


def write_case(group, name, files, expect):
    d = os.path.join(ROOT, group, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    for fname, data in sorted(files.items()):
        assert len(data) < 4096, (group, name, fname)
        with open(os.path.join(d, fname), "wb") as f:
            f.write(data)
    with open(os.path.join(d, "expect"), "w") as f:
        f.write(expect + "\n")


def main():
    for name, (data, expect) in sorted(SAFETENSORS.items()):
        write_case("safetensors", name, {"model.safetensors": data}, expect)
    for name, (files, expect) in sorted(INDEX.items()):
        write_case("index", name, files, expect)
    print("wrote %d safetensors and %d index cases under %s" %
          (len(SAFETENSORS), len(INDEX), os.path.normpath(ROOT)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
