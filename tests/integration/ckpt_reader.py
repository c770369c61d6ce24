#!/usr/bin/python3
"""A reader chainps did not write: opens checkpoints made by ckpt_write_sample with only the
standard library (json, zlib) and numpy, following the safetensors format description
(8-byte little-endian header length N, N bytes of JSON, raw little-endian data), and checks
names, shapes, dtypes, values, metadata, checksums and the Hugging Face index format.
Then runs `chainps checkpoint inspect` on a good and on a damaged copy.

usage: ckpt_reader.py WRITER OUTDIR [CHAINPS]
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np

DTYPES = {"F32": np.dtype("<f4"), "U64": np.dtype("<u8")}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def load_safetensors(path):
    """Return (header dict, {name: np.ndarray}) of one safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    check(8 + n <= len(raw), f"{path}: header length within the file")
    header_bytes = raw[8 : 8 + n]
    header = json.loads(header_bytes.decode("utf-8"))
    data = raw[8 + n :]
    meta = header.get("__metadata__", {})
    check(all(isinstance(v, str) for v in meta.values()), f"{path}: metadata values are strings")
    # Header checksum: CRC-32 of the header bytes with its own 8 hex digits read as zeros.
    hc = meta.get("checksum/__header__")
    check(hc is not None and hc.startswith("crc32:"), f"{path}: header checksum present")
    if hc:
        at = header_bytes.index(b'"checksum/__header__":"crc32:') + len(b'"checksum/__header__":"crc32:')
        zeroed = header_bytes[:at] + b"00000000" + header_bytes[at + 8 :]
        check(f"crc32:{zlib.crc32(zeroed):08x}" == hc, f"{path}: header checksum verifies")
    tensors = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dt = DTYPES[info["dtype"]]
        arr = np.frombuffer(data[begin:end], dtype=dt).reshape(info["shape"])
        tensors[name] = arr
        spans.append((begin, end))
        crc = meta.get("checksum/" + name)
        check(crc == f"crc32:{zlib.crc32(data[begin:end]):08x}", f"{path}: checksum of {name}")
    spans.sort()
    pos = 0
    for b, e in spans:
        check(b == pos, f"{path}: data offsets contiguous")
        pos = e
    check(pos == len(data), f"{path}: tensors cover the data section exactly")
    return header, tensors


def check_values(label, tensors, meta, expected):
    check(sorted(tensors) == sorted(expected["tensors"]), f"{label}: tensor names {sorted(tensors)}")
    for name, exp in expected["tensors"].items():
        if name not in tensors:
            continue
        arr = tensors[name]
        check(list(arr.shape) == exp["shape"], f"{label}: shape of {name}")
        check(arr.dtype == DTYPES[exp["dtype"]], f"{label}: dtype of {name}")
        want = np.array(exp["values"], dtype=DTYPES[exp["dtype"]]).reshape(exp["shape"])
        check(np.array_equal(arr, want), f"{label}: values of {name}")
    check(meta.get("step") == expected["step"], f"{label}: step")
    check(meta.get("optimizer") == expected["optimizer"], f"{label}: optimizer")
    check(meta.get("format") == "pt", f"{label}: format")
    hp = json.loads(meta["hparams/layer1.weight"])
    check(hp["optimizer"] == "adam" and np.float32(hp["lr"]) == np.float32(1e-3), f"{label}: hparams")
    check(meta.get("note") == 'quote " backslash \\ tab \t unicode \u00e9', f"{label}: escaped metadata")


def run_inspect(chainps, path, want_rc, want_text):
    p = subprocess.run([chainps, "checkpoint", "inspect", path], capture_output=True, text=True)
    out = p.stdout + p.stderr
    check(p.returncode == want_rc, f"inspect {path}: exit {p.returncode}, wanted {want_rc}\n{out}")
    check(want_text in out, f"inspect {path}: output lacks {want_text!r}\n{out}")


def main():
    writer, outdir = sys.argv[1], sys.argv[2]
    chainps = sys.argv[3] if len(sys.argv) > 3 else None
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    expected = json.loads(subprocess.run([writer, outdir], check=True, capture_output=True).stdout)

    single = os.path.join(outdir, "single.safetensors")
    header, tensors = load_safetensors(single)
    check_values("single", tensors, header["__metadata__"], expected)

    sdir = os.path.join(outdir, "sharded")
    with open(os.path.join(sdir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    wm = index["weight_map"]
    files = sorted(set(wm.values()))
    check(files == [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)], f"shard names {files}")
    merged, total = {}, 0
    for fn in files:
        h, t = load_safetensors(os.path.join(sdir, fn))
        for name in t:
            check(wm.get(name) == fn, f"weight_map maps {name} to {fn}")
            total += t[name].nbytes
        check(h["__metadata__"]["step"] == "120", f"{fn}: step in every shard")
        merged.update(t)
    check(index["metadata"]["total_size"] == total, "index total_size")
    check(sorted(wm) == sorted(merged), "weight_map lists every tensor once")
    check_values("sharded", merged, index["metadata"], expected)
    check(not [f for f in os.listdir(sdir) if f.endswith(".tmp")], "no temporaries left")

    if chainps:
        run_inspect(chainps, single, 0, "checksums:  all 7 verify")
        run_inspect(chainps, sdir, 0, "checksums:  all 7 verify")
        bad = os.path.join(outdir, "bad.safetensors")
        shutil.copy(single, bad)
        (n,) = struct.unpack("<Q", open(bad, "rb").read(8))
        b, _ = header["embedding"]["data_offsets"]
        with open(bad, "r+b") as f:
            f.seek(8 + n + b + 5)
            byte = f.read(1)
            f.seek(8 + n + b + 5)
            f.write(bytes([byte[0] ^ 0x10]))
        run_inspect(chainps, bad, 1, "BAD embedding")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"ok: {len(expected['tensors'])} tensors, single file and 3 shards, read with json + numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
