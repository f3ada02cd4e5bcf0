#!/usr/bin/env python3
"""Reference verdicts for answer pairs, from the PyPI package math-verify (HuggingFace).

Usage: grader_reference.py PAIRS.jsonl OUT.json
PAIRS.jsonl holds one JSON array [gold, predicted] per line; OUT.json receives a JSON list with
one boolean per pair: math_verify.verify(parse(\\boxed{gold}), parse(\\boxed{predicted})).
Both sides are wrapped in \\boxed{} because that is what kvevict's grader reads from a response.
Exit status 3 when math_verify is not installed (the calling test skips).
"""
import json
import sys

try:
    from math_verify import parse, verify
except ImportError:
    sys.exit(3)


def main() -> None:
    pairs = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
    cache = {}

    def parsed(s):
        if s not in cache:
            cache[s] = parse("\\boxed{" + s + "}")
        return cache[s]

    out = []
    for gold, pred in pairs:
        try:
            out.append(bool(verify(parsed(gold), parsed(pred))))
        except Exception:  # a reference failure counts as "not equal"
            out.append(False)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
