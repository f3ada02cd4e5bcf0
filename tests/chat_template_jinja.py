#!/usr/bin/env python3
"""Renders chat templates with the Python jinja2 package: the independent reference for
tests/chat_template_test.cpp.

Usage: chat_template_jinja.py IN.json OUT.json
IN: {"template": str, "bos_token": str, "eos_token": str,
     "cases": [{"messages": [{"role", "content"}], "add_generation_prompt": bool, "enable_thinking": bool}]}
OUT: list of rendered strings, one per case.
The environment mirrors how transformers' apply_chat_template renders GGUF/HF templates
(sandboxed, trim_blocks + lstrip_blocks, loopcontrols, raise_exception, tojson).
"""
import json
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(spec["template"])
    out = []
    for case in spec["cases"]:
        out.append(template.render(messages=case["messages"], bos_token=spec["bos_token"], eos_token=spec["eos_token"],
                                   add_generation_prompt=case["add_generation_prompt"],
                                   enable_thinking=case["enable_thinking"]))
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
