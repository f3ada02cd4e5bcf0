"""kvevict.evaluate against the `kvevict eval` CLI (a second front end over the same library, run as
a subprocess): the same flags must give the same rollouts (rollouts.jsonl) and the same report
rows (summary.csv, every column but the decode speed, which is a timing). A Python re-implementation
of h2o in the grid must give the built-in h2o's rows."""

import csv
import json

import numpy as np

from conftest import SHARED, STORIES, missing

TIMING = {"decode_tok_s"}


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _same(a, b):
    return {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}


def test_evaluate_equals_cli_eval(stories, cli, kvevict, tmp_path):
    tasks = SHARED / "data" / "gsm8k" / "test.jsonl"
    if not tasks.exists():
        missing(str(tasks))
    out = tmp_path / "cli"
    cli("eval", "-m", STORIES, "-f", tasks, "--limit", 3, "--rollouts", 2, "--policies", "full,random,h2o",
        "--budgets", "24,48", "-r", 8, "--max-new-tokens", 40, "--seed", 3, "-o", out, "--no-plots")

    @kvevict.selector(name="py-h2o", needs=["attention"])
    def py_h2o(c):  # docs/eviction-spec.md §3 row h2o, as in test_selectors.py
        s = c.attention.astype(np.float32)
        unpinned = c.positions >= c.n_pinned
        free = max(0, c.k_sel - int((~unpinned).sum()))
        s[np.flatnonzero(unpinned)[::-1][:free - free // 2]] = np.finfo(np.float32).max
        return s

    res = kvevict.evaluate(stories, tasks, ["full", "random", "h2o", py_h2o], [24, 48], buffer=8, limit=3,
                           rollouts=2, max_new_tokens=40, seed=3)
    ref_rows = _csv_rows(out / "summary.csv")
    # The CSV's text, as evaluate() parsed it back into numbers.
    rows = [{k: "" if v is None else v for k, v in r.items()} for r in res.summary]
    assert [r["policy"] for r in rows] == ["full", "random", "random", "h2o", "h2o", "py-h2o", "py-h2o"]
    for got, ref in zip(rows[:5], ref_rows):
        assert _same({k: str(v) for k, v in got.items()}, ref), (got, ref)
    assert rows[3]["mean_rounds"] > 0
    for h2o, mine in zip(rows[3:5], rows[5:7]):
        assert _same({**h2o, "policy": "py-h2o"}, mine)
    ref_rollouts = {(r["policy"], r["budget"], r["problem_id"], r["rollout"]): r
                    for r in map(json.loads, (out / "rollouts.jsonl").read_text().splitlines())}
    timing = ("prefill_ms", "decode_ms", "score_ms", "compact_ms")
    got_rollouts = [r for r in res.rollouts if r["policy"] != "py-h2o"]
    assert len(got_rollouts) == len(ref_rollouts) == 3 * 5 * 2
    for r in got_rollouts:
        ref = ref_rollouts[(r["policy"], r["budget"], r["problem_id"], r["rollout"])]
        assert {k: v for k, v in r.items() if k not in timing} == {k: v for k, v in ref.items() if k not in timing}
    assert "| h2o |" in res.markdown and res.report["cells"][0]["policy"] == "full"


def test_evaluate_errors(stories, kvevict):
    tasks = SHARED / "data" / "gsm8k" / "test.jsonl"
    import pytest
    with pytest.raises(kvevict.Error, match="reference 'full' is not among the policies"):
        kvevict.evaluate(stories, tasks, ["random"], [16], buffer=4, limit=1)
    with pytest.raises(kvevict.Error, match="unknown policy 'randon'"):
        kvevict.evaluate(stories, tasks, ["full", "randon"], [16], buffer=4, limit=1)
    with pytest.raises(kvevict.Error, match="nonexistent"):
        kvevict.evaluate(stories, "/nonexistent/tasks.jsonl", ["full"], [16])
