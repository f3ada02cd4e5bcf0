"""docs/python.md's walk-through runs as written (from the repository root, as a reader would)."""

import contextlib
import io
import os
import re

from conftest import ROOT, SHARED, STORIES, missing


def test_walkthrough_runs(kvevict):
    if not STORIES.exists():
        missing(str(STORIES))
    text = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/python.md has no ```python block"
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            # The page says ../shared; the tests read $KVEVICT_SHARED.
            code = blocks[0].replace('"../shared/', '"' + str(SHARED) + '/')
            exec(compile(code, "docs/python.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert "error: unknown policy 'randon'" in out.getvalue()
