#!/usr/bin/env python3
"""Copy a GGUF file with metadata keys set or added, tensors unchanged.

    python3 tools/gguf_set_key.py IN.gguf OUT.gguf KEY=VALUE [KEY=VALUE ...]

VALUE is read as bool (true/false), integer (uint32), float (float32) or else string. Meant for
trying how kvevict treats a key before meeting it in a downloaded file, e.g.
`qwen3.rope.scaling.type=yarn`. Uses the `gguf` package (scripts/setup.sh installs it).
Errors (missing file, not GGUF, malformed KEY=VALUE) exit non-zero with one line naming them.
"""
import sys

try:
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
except ImportError:
    sys.exit("gguf_set_key: the Python package 'gguf' is missing (bash scripts/setup.sh installs it)")


def parse_value(text):
    if text in ("true", "false"):
        return text == "true", GGUFValueType.BOOL
    try:
        return int(text), GGUFValueType.UINT32
    except ValueError:
        pass
    try:
        return float(text), GGUFValueType.FLOAT32
    except ValueError:
        return text, GGUFValueType.STRING


def main(argv):
    if len(argv) < 4:
        sys.exit("usage: gguf_set_key.py IN.gguf OUT.gguf KEY=VALUE [KEY=VALUE ...]")
    src, dst, pairs = argv[1], argv[2], argv[3:]
    changes = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            sys.exit(f"gguf_set_key: '{p}' is not KEY=VALUE")
        changes[key] = parse_value(value)
    try:
        reader = GGUFReader(src, "r")
    except (OSError, ValueError) as e:
        sys.exit(f"gguf_set_key: cannot read '{src}' as GGUF: {e}")
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for name, field in reader.fields.items():
        # The writer adds these itself (architecture from arch=, the rest from the header).
        if name.startswith("GGUF.") or name == "general.architecture" or name in changes:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for key, (value, vtype) in changes.items():
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    print(f"wrote {dst}: {len(reader.tensors)} tensors, set {', '.join(changes)}")


if __name__ == "__main__":
    main(sys.argv)
