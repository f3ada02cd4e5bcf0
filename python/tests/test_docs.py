"""docs/python.md's walk-through runs as written (from the repository root, as a reader would) and
prints exactly the output the page shows (everything in it is seeded or greedy)."""

import contextlib
import io
import os
import re

from conftest import ROOT, missing

REASONER = ROOT / "models" / "reasoner" / "reasoner.gguf"


def test_walkthrough_prints_what_the_page_shows(kvevict, cli, tmp_path):
    if not REASONER.exists():
        missing(str(REASONER))
    text = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    m = re.search(r"```python\n(.*?)```\n\nOutput[^\n]*\n\n```text\n(.*?)```", text, re.S)
    assert m, "docs/python.md has no ```python block followed by its ```text output"
    code, shown = m.groups()
    # The page's `$ ./build/kvevict tasks gen ... -o out/chain.jsonl`, written here instead.
    gen = re.search(r"\$ \./build/kvevict (tasks gen [^\n]*) -o out/chain\.jsonl", text)
    assert gen, "the page no longer generates out/chain.jsonl"
    tasks = tmp_path / "chain.jsonl"
    cli(*gen.group(1).split(), "-o", tasks)
    code = code.replace('"out/chain.jsonl"', repr(str(tasks)))
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/python.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert out.getvalue() == shown
