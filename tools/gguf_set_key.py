#!/usr/bin/env python3
"""Copy a GGUF file with metadata keys set or added, tensors unchanged.

    python3 tools/gguf_set_key.py IN.gguf OUT.gguf KEY=VALUE [KEY=VALUE ...]

A key the file already has keeps its type (VALUE must fit it); a new key is read as bool
(true/false), integer (uint32), float (float32) or else string. Meant for trying how kvevict
treats a key before meeting it in a downloaded file, e.g. `qwen3.rope.scaling.type=yarn`. The
output is written to a temporary file and renamed, and must not be the input. Uses the `gguf`
package (scripts/setup.sh installs it). Errors (missing file, not GGUF, same file, malformed
KEY=VALUE, a value that does not fit its type) exit non-zero with one line naming them.
"""
import os
import sys
import tempfile

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


INT_RANGES = {
    GGUFValueType.UINT8: (0, 2**8 - 1), GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1), GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1), GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1), GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}


def typed_value(key, text, vtype):
    """TEXT read as the existing key's type; exits naming the key when it does not fit."""
    name = vtype.name.lower()
    if vtype == GGUFValueType.BOOL:
        if text not in ("true", "false"):
            sys.exit(f"gguf_set_key: {key}={text}: the file's {key} is a bool (true or false)")
        return text == "true"
    if vtype in INT_RANGES:
        lo, hi = INT_RANGES[vtype]
        try:
            v = int(text)
        except ValueError:
            sys.exit(f"gguf_set_key: {key}={text}: the file's {key} is {name}, not an integer")
        if not lo <= v <= hi:
            sys.exit(f"gguf_set_key: {key}={text}: out of {name}'s range [{lo}, {hi}]")
        return v
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        try:
            return float(text)
        except ValueError:
            sys.exit(f"gguf_set_key: {key}={text}: the file's {key} is {name}, not a number")
    if vtype == GGUFValueType.STRING:
        return text
    sys.exit(f"gguf_set_key: {key}: the file's value is {name}; only scalar keys can be set")


def main(argv):
    if len(argv) < 4:
        sys.exit("usage: gguf_set_key.py IN.gguf OUT.gguf KEY=VALUE [KEY=VALUE ...]")
    src, dst, pairs = argv[1], argv[2], argv[3:]
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst):
        sys.exit(f"gguf_set_key: '{dst}' is the input file; write the copy elsewhere")
    raw = []
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            sys.exit(f"gguf_set_key: '{p}' is not KEY=VALUE")
        raw.append((key, value))
    try:
        reader = GGUFReader(src, "r")
    except (OSError, ValueError) as e:
        sys.exit(f"gguf_set_key: cannot read '{src}' as GGUF: {e}")
    changes = {}
    for key, value in raw:
        if key in reader.fields:
            vtype = reader.fields[key].types[0]
            changes[key] = (typed_value(key, value, vtype), vtype)
        else:
            changes[key] = parse_value(value)
            if changes[key][1] == GGUFValueType.UINT32 and not 0 <= changes[key][0] < 2**32:
                sys.exit(f"gguf_set_key: {key}={value}: a new integer key is uint32, range [0, 4294967295]")
    arch = reader.fields["general.architecture"].contents()
    fd, tmp = tempfile.mkstemp(prefix=".gguf_set_key.", dir=os.path.dirname(os.path.abspath(dst)))
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would surprise: a plain new file's mode
    try:
        writer = GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
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
        os.replace(tmp, dst)
    except Exception as e:  # noqa: BLE001 — one line, and no half-written output
        sys.exit(f"gguf_set_key: writing '{dst}' failed: {e}")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"wrote {dst}: {len(reader.tensors)} tensors, set {', '.join(changes)}")


if __name__ == "__main__":
    main(sys.argv)
