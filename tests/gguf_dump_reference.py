#!/usr/bin/env python3
"""Dumps a GGUF file's header, metadata and tensor table to JSON using llama.cpp's own Python
reader (the PyPI `gguf` package), as an independent reference for tests/gguf_test.cpp.

Usage: gguf_dump_reference.py MODEL.gguf OUT.json

Output: {"version", "alignment", "data_offset",
         "metadata": {key: node}, "tensors": [{"name", "dims", "type", "offset", "n_bytes",
                                               "head", "tail"}]}
where node = {"type": "uint32", "value": 5}; arrays are {"type": "array", "elem_type": ...,
"value": [node, ...]}. Strings are hex of their raw bytes, so any byte sequence compares exactly.
"dims" are in GGUF order (dims[0] innermost); "offset" is relative to the data section; "head"
and "tail" are hex of the first and last (up to) 16 bytes of the tensor's data.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType


def decode(parts, i, vtype):
    """Decodes the value whose first part is parts[i]; returns (node, next part index).

    Walks the reader's raw parts instead of ReaderField.contents(), which flattens nested arrays.
    """
    if vtype == GGUFValueType.STRING:  # parts: length, bytes
        return {"type": "string", "value": bytes(parts[i + 1]).hex()}, i + 2
    if vtype == GGUFValueType.ARRAY:  # parts: element type, count, elements...
        etype = GGUFValueType(int(parts[i][0]))
        count = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(count):
            node, i = decode(parts, i, etype)
            items.append(node)
        return {"type": "array", "elem_type": etype.name.lower(), "value": items}, i
    raw = parts[i][0]
    if vtype == GGUFValueType.BOOL:
        value = bool(raw)
    elif vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        value = float(raw)  # float32 -> double is exact; json writes a round-trip repr
    else:
        value = int(raw)
    return {"type": vtype.name.lower(), "value": value}, i + 1


def main():
    path, out_path = sys.argv[1], sys.argv[2]
    reader = GGUFReader(path)
    raw = np.memmap(path, mode="r")
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the reader's pseudo-fields for the header
            continue
        # Key field parts: key length, key bytes, value type, value parts...
        metadata[key], _ = decode(field.parts, 3, field.types[0])
    tensors = []
    for t in reader.tensors:
        data = bytes(raw[t.data_offset:t.data_offset + t.n_bytes])
        tensors.append({
            "name": t.name,
            "dims": [int(d) for d in t.shape],
            "type": int(t.tensor_type),
            "offset": int(t.data_offset - reader.data_offset),
            "n_bytes": int(t.n_bytes),
            "head": data[:16].hex(),
            "tail": data[-16:].hex(),
        })
    out = {
        "version": int(reader.fields["GGUF.version"].parts[0][0]),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "metadata": metadata,
        "tensors": tensors,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
