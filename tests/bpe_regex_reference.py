#!/usr/bin/env python3
"""Pre-tokenizer splits by the Python `regex` package: the independent reference for
tests/tokenizer_regex_test.cpp (kvevict runs the same patterns on PCRE2).

Usage: bpe_regex_reference.py IN.json OUT.json
IN: {"pre": "qwen2" | "llama3" | "gpt4o", "texts": [str]}; OUT: [[str, ...], ...] (findall per text).
Patterns as the models' tokenizer.json files state them (Qwen2, Llama-3 / cl100k, GPT-4o / o200k).
"""
import json
import sys

import regex

PATTERNS = {
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "gpt4o": "|".join([
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]),
}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    pattern = regex.compile(PATTERNS[spec["pre"]])
    out = [pattern.findall(t) for t in spec["texts"]]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
