#!/usr/bin/env python3
"""Reference side of tests/safetensors_test.cpp and tests/hf_checkpoint_test.cpp, using the PyPI
`safetensors` package (the format's reference implementation) and NumPy.

  safetensors_reference.py write OUT   write F32/F16/BF16 [3, 5] arrays of i * 0.25 - 3 (exact in
                                       all three types) and an I64 array, metadata writer=...

Also the writing helpers of tests/hf_reference.py and fuzz/make_safetensors_seed.py (save, encode).
"""
import sys

import numpy as np


def save(arrays, out, metadata=None):
    """Writes {name: (safetensors dtype name, shape, bytes)} with the package's own serializer
    (NumPy has no bfloat16, so BF16 data is passed as raw bytes). Works with the package's
    TensorSpec API (0.7+) and the older dict API."""
    import safetensors
    keep = []
    if hasattr(safetensors, "TensorSpec"):
        spec = {}
        for k, (dtype, shape, raw) in arrays.items():
            buf = np.frombuffer(raw, dtype=np.uint8).copy() if raw else np.zeros(1, dtype=np.uint8)
            keep.append(buf)
            spec[k] = safetensors.TensorSpec(dtype=dtype, shape=tuple(shape), data_ptr=buf.ctypes.data,
                                             data_len=len(raw))
        safetensors.serialize_file(spec, out, metadata=metadata)
    else:
        safetensors.serialize_file({k: {"dtype": d, "shape": list(s), "data": r} for k, (d, s, r) in arrays.items()},
                                   out, metadata=metadata)


def bf16_bytes(a):
    """float32 array -> bfloat16 bytes, rounding to nearest even (as torch does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).tobytes()


def encode(a, dtype):
    """A float array as (package dtype name, shape, bytes) in safetensors dtype F32, F16 or BF16."""
    if dtype == "F32":
        return ("float32", a.shape, np.ascontiguousarray(a, dtype=np.float32).tobytes())
    if dtype == "F16":
        return ("float16", a.shape, np.ascontiguousarray(a, dtype=np.float16).tobytes())
    return ("bfloat16", a.shape, bf16_bytes(a))


def write(out):
    v = np.arange(15, dtype=np.float32).reshape(3, 5) * 0.25 - 3.0
    save({"f32": ("float32", v.shape, v.tobytes()),
          "f16": ("float16", v.shape, v.astype(np.float16).tobytes()),
          "bf16": ("bfloat16", v.shape, bf16_bytes(v)),
          "i64": ("int64", (4,), np.arange(4, dtype=np.int64).tobytes())},
         out, metadata={"writer": "safetensors_reference.py"})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        sys.exit(__doc__)
