#!/usr/bin/env python3
"""Independent quantisation reference for tests/quant_test.cpp, from llama.cpp's own Python
package (PyPI `gguf`: gguf.quants.dequantize / quantize, GGUFReader).

Usage:
  quant_reference.py tensors MODEL.gguf MAX_ELEMS OUT.json
      For every quantised tensor of MODEL (read by GGUFReader, not by kvevict): its name, type
      id, element count, and the dequantised float32 values of its first and last MAX_ELEMS
      elements (whole rows of blocks) as hex of little-endian float32 bytes.
  quant_reference.py dequant TYPE IN.bin OUT.bin
      Raw blocks of ggml type TYPE (e.g. q4_k) -> little-endian float32 values.
  quant_reference.py quantize TYPE IN.bin OUT.bin
      Little-endian float32 values -> raw blocks, with gguf.quants.quantize (only the types the
      package can quantise: q4_0, q4_1, q5_0, q5_1, q8_0).
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize
from gguf.constants import GGML_QUANT_SIZES

FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}


def qtype(name):
    return GGMLQuantizationType[name.upper()]


def tensors(path, max_elems, out_path):
    reader = GGUFReader(path)
    out = []
    for t in reader.tensors:
        if t.tensor_type in FLOAT_TYPES:
            continue
        block_elems, block_bytes = GGML_QUANT_SIZES[t.tensor_type]
        raw = np.asarray(t.data, dtype=np.uint8).reshape(-1)
        n_blocks = raw.size // block_bytes
        take = min(n_blocks, max(1, max_elems // block_elems))
        head = raw[: take * block_bytes]
        tail = raw[(n_blocks - take) * block_bytes:]
        out.append({
            "name": t.name,
            "type": int(t.tensor_type),
            "n_elements": int(n_blocks * block_elems),
            "head_elems": int(take * block_elems),
            "head": dequantize(head, t.tensor_type).astype("<f4").reshape(-1).tobytes().hex(),
            "tail": dequantize(tail, t.tensor_type).astype("<f4").reshape(-1).tobytes().hex(),
        })
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


def main():
    mode = sys.argv[1]
    if mode == "tensors":
        tensors(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif mode == "dequant":
        t = qtype(sys.argv[2])
        raw = np.fromfile(sys.argv[3], dtype=np.uint8)
        dequantize(raw, t).astype("<f4").reshape(-1).tofile(sys.argv[4])
    elif mode == "quantize":
        t = qtype(sys.argv[2])
        x = np.fromfile(sys.argv[3], dtype="<f4")
        np.asarray(quantize(x.reshape(1, -1), t), dtype=np.uint8).reshape(-1).tofile(sys.argv[4])
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
