"""Selectors written in Python (kvevict.Selector) against the built-in selectors.

References: the built-in `recency` and `h2o` selectors (C++, src/eviction/selectors/) run by the
same engine under the same schedule; their keep-sets, taken from generate(keep_log=True) after
every eviction round, must equal those of the Python re-implementations exactly. The Python
h2o follows docs/eviction-spec.md §3 row `h2o` (H2O, arXiv 2306.14048 §3): accumulated attention,
K_sel minus the pinned candidates split heavy : newest = 1 : 1 (heavy count rounded down).
The keep log itself is checked against the CLI's `--keep-log --keep-log-positions` file.
"""

import json
import warnings

import numpy as np
import pytest

from conftest import STORIES

PROMPT = "Once upon a time, there was a little dog"


@pytest.fixture(scope="module")
def py(kvevict):
    @kvevict.selector(name="py-recency")
    def recency(c):
        return np.arange(c.n_candidates, dtype=np.float32)

    @kvevict.selector(name="py-recency-idx")
    def recency_indices(c):
        # The pinned candidates are kept anyway: the newest of the others fill the rest of K_sel.
        free = np.flatnonzero(c.positions >= c.n_pinned)
        room = c.k_sel - (c.n_candidates - free.size)
        return free[free.size - room:]

    @kvevict.selector(name="py-h2o", needs=["attention"])
    def h2o(c):
        s = c.attention.astype(np.float32)
        unpinned = c.positions >= c.n_pinned
        free = max(0, c.k_sel - int((~unpinned).sum()))
        newest = free - int(np.floor(free * 0.5))
        s[np.flatnonzero(unpinned)[::-1][:newest]] = np.finfo(np.float32).max
        return s

    return dict(recency=recency, recency_idx=recency_indices, h2o=h2o)


# (budget, buffer, seed, sinks, protect_prompt): several schedules, pinned and not.
SCHEDULES = [(16, 8, 1, None, None), (24, 4, 2, 2, None), (12, 4, 3, None, True)]


@pytest.mark.parametrize("budget, buffer, seed, sinks, protect", SCHEDULES)
@pytest.mark.parametrize("builtin, mine", [("recency", "recency"), ("recency", "recency_idx"), ("h2o", "h2o")])
def test_python_selector_keeps_what_the_builtin_keeps(stories, py, builtin, mine, budget, buffer, seed, sinks,
                                                      protect):
    kw = dict(budget=budget, buffer=buffer, seed=seed, sinks=sinks, protect_prompt=protect, max_tokens=80,
              temperature=1.0, ignore_eos=True, keep_log=True)
    ref = stories.generate(PROMPT, policy=builtin, **kw)
    got = stories.generate(PROMPT, policy=py[mine], **kw)
    assert ref.eviction_rounds >= 5, "the comparison needs several eviction rounds"
    assert got.eviction_rounds == ref.eviction_rounds
    np.testing.assert_array_equal(got.keep_log["positions"], ref.keep_log["positions"])
    assert got.tokens == ref.tokens
    assert got.policy == py[mine].name


def test_python_selector_in_perplexity(stories, py):
    text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. " * 2
    ref = stories.perplexity(text, policy="h2o", budget=12, buffer=4)
    got = stories.perplexity(text, policy=py["h2o"], budget=12, buffer=4)
    assert ref.eviction_rounds > 3 and got.eviction_rounds == ref.eviction_rounds
    assert got.nll == ref.nll


def test_same_keep_sets_whatever_the_thread_count(stories, py):
    kw = dict(policy=py["h2o"], budget=16, buffer=4, max_tokens=60, ignore_eos=True, keep_log=True)
    a = stories.generate(PROMPT, threads=1, **kw)
    b = stories.generate(PROMPT, threads=2, **kw)
    np.testing.assert_array_equal(a.keep_log["positions"], b.keep_log["positions"])


def test_selector_exception_reaches_the_caller(stories, kvevict):
    class NoScores(Exception):
        pass

    class Raising(kvevict.Selector):
        name = "raising"

        def score(self, c):
            if c.layer == 2:
                raise NoScores(f"no scores for layer {c.layer}")
            return np.zeros(c.n_candidates)

    with pytest.raises(NoScores, match="no scores for layer 2"):
        stories.generate(PROMPT, policy=Raising(), budget=8, buffer=4, max_tokens=30, ignore_eos=True)
    # The model is still usable.
    assert stories.generate(PROMPT, policy="full", max_tokens=3).tokens


@pytest.mark.parametrize(
    "result, message",
    [
        (lambda c: np.zeros(c.n_candidates - 1), r"\(layer 0, KV head 0\): returned \d+ scores for \d+ candidates"),
        (lambda c: np.full(c.n_candidates, np.nan), "score 0 is NaN"),
        (lambda c: [c.n_candidates], r"index \d+ outside \[0, \d+\)"),
        (lambda c: [-1], r"index -1 outside"),
        (lambda c: np.arange(c.k_sel + 1), r"returned \d+ indices; the round keeps K_sel = 4"),
        (lambda c: [0, 0], "an index appears twice"),
        (lambda c: np.zeros((2, c.n_candidates)), "shape"),
        (lambda c: ["x"] * c.n_candidates, "dtype"),
    ],
)
def test_bad_selector_result_is_a_clear_error(stories, kvevict, result, message):
    sel = kvevict.selector(result, name="bad")
    with pytest.raises(kvevict.Error, match=message):
        stories.generate(PROMPT, policy=sel, budget=8, buffer=4, max_tokens=30, ignore_eos=True)


def test_keeping_a_view_is_an_error(stories, kvevict):
    kept = []

    @kvevict.selector
    def hoarder(c):
        kept.append(c.keys)
        return np.zeros(c.n_candidates)

    with pytest.raises(kvevict.Error, match="kept its candidates or a view of them past the call"):
        stories.generate(PROMPT, policy=hoarder, budget=8, buffer=4, max_tokens=30, ignore_eos=True)


def test_selector_inputs(stories, kvevict):
    seen = {}

    @kvevict.selector(needs=["queries", "queries_pre", "attention"], window=6)
    def probe(c):
        if c.layer == 1 and c.kv_head == 0 and c.round == 1:
            seen.update(keys=np.array(c.keys), values=np.array(c.values), pos=np.array(c.positions),
                        q=np.array(c.queries), qpre=np.array(c.queries_pre), qpos=np.array(c.query_positions),
                        att=np.array(c.attention), n_seen=c.n_seen, group=c.group_size, k_sel=c.k_sel,
                        n=c.n_candidates)
        return np.zeros(c.n_candidates)

    stories.generate(PROMPT, policy=probe, budget=8, buffer=4, max_tokens=20, ignore_eos=True)
    n, hd = seen["n"], stories.head_dim
    assert n == 8 and seen["k_sel"] == 4  # a round runs at B + r = 12 live slots; candidates = 12 - r
    assert seen["keys"].shape == seen["values"].shape == (n, hd)
    assert np.all(np.diff(seen["pos"]) > 0)
    group = stories.n_heads // stories.n_kv_heads
    assert seen["group"] == group and seen["q"].shape == seen["qpre"].shape == (6, group, hd)
    # The held queries are the newest six: positions n_seen - 6 .. n_seen - 1.
    np.testing.assert_array_equal(seen["qpos"], np.arange(seen["n_seen"] - 6, seen["n_seen"]))
    # Un-rotation is a rotation: it keeps each query's norm and changes the vector (positions > 0).
    np.testing.assert_allclose(np.linalg.norm(seen["qpre"], axis=-1), np.linalg.norm(seen["q"], axis=-1), rtol=1e-5)
    assert not np.allclose(seen["qpre"], seen["q"])
    # Accumulated attention: every query adds probabilities summing to 1 per query head, so a slot
    # holds at most (queries since it entered) x group; all are >= 0.
    assert np.all(seen["att"] >= 0) and seen["att"].sum() > 0


def test_selector_name_and_needs_are_checked(stories, kvevict):
    with pytest.raises(kvevict.Error, match="built-in policy"):
        stories.generate(PROMPT, policy=kvevict.selector(lambda c: None, name="random"), budget=8, buffer=4)
    with pytest.raises(kvevict.Error, match="must be one of"):
        stories.generate(PROMPT, policy=kvevict.selector(lambda c: None, needs=["probs"]), budget=8, buffer=4)
    with pytest.raises(kvevict.Error, match="takes none"):
        stories.generate(PROMPT, policy=kvevict.selector(lambda c: None), budget=8, buffer=4, params=["window=3"])


def test_keep_log_equals_cli_keep_log(stories, cli, tmp_path):
    # Reference: `kvevict generate --keep-log FILE --keep-log-positions` (one JSON line per round and layer).
    log = tmp_path / "keep.jsonl"
    cli("generate", "-m", STORIES, "-p", PROMPT, "-n", 60, "--temp", 0, "--ignore-eos", "--policy", "random", "-B", 16,
        "-r", 4, "--seed", 5, "--keep-log", log, "--keep-log-positions")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    out = stories.generate(PROMPT, policy="random", budget=16, buffer=4, seed=5, max_tokens=60, ignore_eos=True,
                           keep_log=True)
    pos = out.keep_log["positions"]
    assert pos.shape == (out.eviction_rounds, stories.n_layers, stories.n_kv_heads, 16)
    assert len(lines) == out.eviction_rounds * stories.n_layers
    for line in lines:
        np.testing.assert_array_equal(pos[line["round"], line["layer"]], np.array(line["positions"]))
    assert list(out.keep_log["n_seen"]) == [line["n_seen"] for line in lines if line["layer"] == 0]


def test_per_step_statistics(stories):
    out = stories.generate(PROMPT, policy="random", budget=16, buffer=4, max_tokens=50, ignore_eos=True)
    st = out.steps
    assert len(st["live_slots"]) == out.decode_steps
    # Recorded after any round: a round runs at B + r = 20 live slots (the peak) and leaves B = 16.
    assert out.peak_slots == 20 and st["live_slots"].max() == 19
    assert st["eviction_rounds"][-1] == out.eviction_rounds
    # A round leaves exactly B slots; it runs at B + r.
    rounds_at = np.flatnonzero(np.diff(np.concatenate([[0], st["eviction_rounds"]])))
    assert np.all(st["live_slots"][rounds_at] == 16) and np.all(st["round_ms"][rounds_at] >= 0)
    assert np.isclose(st["round_ms"].sum(), out.score_ms + out.compact_ms)
    assert np.isclose(st["decode_ms"].sum(), out.decode_ms)
    assert out.keep_log is None


def test_full_with_a_schedule_warns_and_negative_seed_is_refused(stories, kvevict):
    # As the CLI: "policy 'full' keeps every token: --budget 32 is unused" (a warning, not an error).
    with pytest.warns(UserWarning, match="policy 'full' keeps every token: budget=32 unused"):
        stories.generate(PROMPT, policy="full", budget=32, max_tokens=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stories.generate(PROMPT, policy="full", max_tokens=2)
    with pytest.raises(ValueError, match=r"seed -1: must be in \[0, 2\^64\)"):
        stories.generate(PROMPT, seed=-1, max_tokens=2)
    with pytest.raises(kvevict.Error, match="seed -3"):
        stories.perplexity(PROMPT, seed=-3)
