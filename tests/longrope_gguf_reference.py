#!/usr/bin/env python3
"""LongRoPE names and values as llama.cpp's own Python package (PyPI `gguf`) states and reads them,
an independent reference for tests/longrope_test.cpp.

Usage: longrope_gguf_reference.py MODEL.gguf OUT.json

Output: {"tensor_long", "tensor_short": tensor names (with ".weight"),
         "key_attn_factor", "key_original_context": metadata keys for arch phi3,
         "archs_with_longrope": which of llama, qwen2, qwen3, phi3 list the factor tensors,
         "file": {"long", "short": factor values, "attn_factor", "original_context",
                  "context_length"} read from MODEL.gguf with gguf.GGUFReader}.
"""
import json
import sys

from gguf import GGUFReader, Keys, MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES


def scalar(reader, key):
    field = reader.fields[key]
    return field.parts[field.data[0]][0].item()


def main():
    path, out = sys.argv[1], sys.argv[2]
    ref = {
        "tensor_long": TENSOR_NAMES[MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight",
        "tensor_short": TENSOR_NAMES[MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight",
        "key_attn_factor": Keys.Rope.SCALING_ATTN_FACTOR.format(arch="phi3"),
        "key_original_context": Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch="phi3"),
        "archs_with_longrope": sorted(
            MODEL_ARCH_NAMES[a]
            for a in (MODEL_ARCH.LLAMA, MODEL_ARCH.QWEN2, MODEL_ARCH.QWEN3, MODEL_ARCH.PHI3)
            if MODEL_TENSOR.ROPE_FACTORS_LONG in MODEL_TENSORS[a] and MODEL_TENSOR.ROPE_FACTORS_SHORT in MODEL_TENSORS[a]
        ),
    }
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    ref["file"] = {
        "long": [float(v) for v in tensors[ref["tensor_long"]].data],
        "short": [float(v) for v in tensors[ref["tensor_short"]].data],
        "attn_factor": float(scalar(reader, ref["key_attn_factor"])),
        "original_context": int(scalar(reader, ref["key_original_context"])),
        "context_length": int(scalar(reader, Keys.LLM.CONTEXT_LENGTH.format(arch="phi3"))),
    }
    with open(out, "w") as f:
        json.dump(ref, f)


if __name__ == "__main__":
    main()
