"""Inputs a first-time user gets wrong: each is refused with a clear error naming the value and
what is expected, or taken the way the user meant it; never a crash, an out-of-memory kill, a
read of freed memory or a silent cast. References: the expected values are written here (a
window bound of 65536 = snapkv's `window` parameter bound in src/eviction/query_window.cpp; the
stories260K model's context length 2048 from its GGUF header); the stop-string behaviour is
OpenAI's (a str `stop` is one stop string).
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import SHARED, STORIES

PROMPT = "Once upon a time, there was a little dog"


def test_huge_window_is_refused_before_allocating(kvevict):
    # In a child capped at 2 GiB of address space: a window allocated before the check would die
    # there (bad_alloc / MemoryError / kill) instead of raising the Error this test expects.
    if not STORIES.exists():
        pytest.skip(f"{STORIES} is missing")
    code = textwrap.dedent(f"""
        import resource, numpy as np, kvevict
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        m = kvevict.Model({str(STORIES)!r})
        sel = kvevict.selector(lambda c: np.zeros(c.n_candidates), name="wide", needs=["queries"], window=10**9)
        try:
            m.generate("Once upon a time", policy=sel, budget=32, buffer=8, max_tokens=40)
        except kvevict.Error as e:
            print("ERROR", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ERROR" in r.stdout and "window 1000000000" in r.stdout and "65536" in r.stdout, r.stdout


def test_window_above_the_context_length_is_refused(stories, kvevict):
    sel = kvevict.selector(lambda c: np.zeros(c.n_candidates), name="wide", needs="queries", window=4096)
    with pytest.raises(kvevict.Error, match="window 4096: exceeds the model's context length 2048"):
        stories.generate(PROMPT, policy=sel, budget=8, buffer=4, max_tokens=4)
    with pytest.raises(kvevict.Error, match=r"window 0: must be in \[1, 65536\]"):
        stories.generate(PROMPT, policy=kvevict.selector(lambda c: None, needs=["queries"], window=0), budget=8,
                         buffer=4)


def test_a_kept_array_reads_the_data_of_its_call(kvevict):
    # A kept array must stay the data the selector saw (compared with a copy made during the
    # call), after the sequence, the model and the freed memory's reuse. Run in a child so that a
    # read of freed memory (a crash) fails this test instead of the whole run.
    if not STORIES.exists():
        pytest.skip(f"{STORIES} is missing")
    code = textwrap.dedent(f"""
        import gc, numpy as np, kvevict
        m = kvevict.Model({str(STORIES)!r})
        kept, copies = [], []
        def keep(c):
            if not kept:
                for a in (c.keys, c.values, c.positions, c.queries, c.queries_pre, c.query_positions, c.attention):
                    kept.append(a); copies.append(np.array(a))
            return np.zeros(c.n_candidates)
        sel = kvevict.selector(keep, name="k", needs=["queries", "queries_pre", "attention"], window=4)
        try:
            m.generate("Once upon a time", policy=sel, budget=32, buffer=8, max_tokens=80, ignore_eos=True)
        except kvevict.Error as e:
            print("ERROR", str(e)[:60])
        del m; gc.collect()
        junk = [np.full(1 << 16, 7.0) for _ in range(200)]
        print("SAME", all(np.array_equal(a, b) for a, b in zip(kept, copies)))
        print("READONLY", not any(a.flags.writeable for a in kept))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ERROR selector 'k'" in r.stdout  # keeping them is still refused
    assert "SAME True" in r.stdout and "READONLY True" in r.stdout, r.stdout


def test_a_str_stop_is_one_stop_string(stories):
    # Reference: the greedy continuation without stops (" girl named Lily. She loved to play
    # outside in the park. ..."); stop="park" must cut before the first "park" (as
    # stop=["park"]), not before the first "p", "a", "r" or "k" (the "a" of " named").
    prompt = "Once upon a time, there was a little"
    full = stories.generate(prompt, policy="full", max_tokens=40).text
    assert "park" in full and full.index("a") < full.index("park"), full
    cut = stories.generate(prompt, policy="full", max_tokens=40, stop="park").text
    assert cut == full[:full.index("park")]
    assert cut == stories.generate(prompt, policy="full", max_tokens=40, stop=["park"]).text


@pytest.mark.parametrize("result, shown", [(lambda c: None, "NoneType"), (lambda c: "abc", "str"),
                                           (lambda c: (i for i in range(c.n_candidates)), "generator")])
def test_selector_result_of_a_wrong_type_names_its_type(stories, kvevict, result, shown):
    with pytest.raises(kvevict.Error, match=rf"returned {shown}; expected a 1-D array of \d+ float scores or of "
                                            rf"at most \d+ integer indices"):
        stories.generate(PROMPT, policy=kvevict.selector(result, name="t"), budget=8, buffer=4, max_tokens=30,
                         ignore_eos=True)


def test_needs_given_as_one_str(stories, kvevict):
    seen = []

    @kvevict.selector(needs="attention")
    def h(c):
        seen.append(np.array(c.attention).sum())
        return np.zeros(c.n_candidates)

    assert h.needs == ("attention",)
    stories.generate(PROMPT, policy=h, budget=8, buffer=4, max_tokens=20, ignore_eos=True)
    assert seen and seen[0] > 0
    with pytest.raises(kvevict.Error, match="needs 'attn': must be one of"):
        kvevict.selector(lambda c: None, needs="attn")


def test_empty_selector_name_is_refused(kvevict):
    with pytest.raises(kvevict.Error, match="selector name '': must be a non-empty string"):
        kvevict.selector(lambda c: None, name="")


def test_bool_keywords_are_checked_by_name(stories):
    for kw in ("keep_log", "ignore_eos", "special"):
        with pytest.raises(TypeError, match=rf"^{kw}='yes': must be True or False$"):
            stories.generate(PROMPT, max_tokens=2, **{kw: "yes"})


def test_prompt_must_be_str_or_ints(stories, kvevict):
    with pytest.raises(kvevict.Error, match="prompt: got bytes; expected a str or a list of int token ids"):
        stories.generate(b"Once upon a time", max_tokens=2)
    with pytest.raises(kvevict.Error, match=r"prompt: token 1.5 is float"):
        stories.generate([1, 1.5], max_tokens=2)
    with pytest.raises(kvevict.Error, match="text: got bytes"):
        stories.perplexity(b"Once upon a time")


def test_evaluate_takes_one_policy_and_refuses_fractional_budgets(stories, kvevict):
    tasks = SHARED / "data" / "gsm8k" / "test.jsonl"
    if not tasks.exists():
        pytest.skip(f"{tasks} is missing")
    with pytest.raises(kvevict.Error, match=r"budgets: 64.5 is not an integer"):
        kvevict.evaluate(stories, tasks, ["full", "random"], budgets=[64.5], limit=1)
    r = kvevict.evaluate(stories, tasks, "full", rollouts=1, max_new_tokens=2, bootstrap=100, limit=1)
    assert [row["policy"] for row in r.summary] == ["full"]
