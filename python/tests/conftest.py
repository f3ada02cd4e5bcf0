"""Fixtures of the Python package's tests.

Where things come from: the package is the one `pip install .` installed, or the build tree's
(PYTHONPATH=build/python after a -DKVEVICT_BUILD_PYTHON=ON build); the reference CLI is
$KVEVICT_BIN (default build/kvevict); models are read from $KVEVICT_SHARED (default ../shared).
A missing piece skips the tests that need it, except under CI=true, where it fails them (as the
C++ suite's test_paths.h does).
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("KVEVICT_SHARED", ROOT.parent / "shared"))
CLI = Path(os.environ.get("KVEVICT_BIN", ROOT / "build" / "kvevict"))
STORIES = SHARED / "models" / "stories260K" / "stories260K.gguf"
TINYSTORIES_656K = SHARED / "models" / "tinystories-656k"


def missing(what: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing (CI=true: required)")
    pytest.skip(f"{what} is missing")


def need_module(name: str):
    try:
        return __import__(name)
    except ImportError:
        missing(f"the Python package {name} (scripts/setup.sh --test installs it)")


@pytest.fixture(scope="session")
def kvevict():
    try:
        import kvevict as k
    except ImportError as e:
        missing(f"the kvevict package ({e}); run `pip install .`")
    return k


@pytest.fixture(scope="session")
def stories(kvevict):
    if not STORIES.exists():
        missing(str(STORIES))
    return kvevict.Model(str(STORIES))


@pytest.fixture(scope="session")
def cli():
    if not CLI.exists():
        missing(f"the kvevict CLI {CLI} (build it, or set KVEVICT_BIN)")

    def run(*args, ok=True):
        r = subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=120)
        if ok:
            assert r.returncode == 0, r.stderr
        return r

    return run
