#!/usr/bin/env python3
"""Cost of a selector written in Python per eviction round, against the built-in selector it
re-implements, in the same run (A/B alternated), for docs/python.md.

Usage: python3 scripts/python-selector-overhead.py [MODEL] [--reps N]
Reports per policy the scoring time of one round (SequenceStats score_ms / rounds: the selector's
part of a round; compaction is the same code for both) as median [min-max] over the reps, the
Python/built-in ratio of the medians, and the load average. Needs the package (`pip install .`).
"""

import argparse
import os
import statistics

import numpy as np

import kvevict


@kvevict.selector(name="py-recency")
def py_recency(c):
    return np.arange(c.n_candidates, dtype=np.float32)


@kvevict.selector(name="py-h2o", needs=["attention"])
def py_h2o(c):
    s = c.attention.astype(np.float32)
    unpinned = c.positions >= c.n_pinned
    free = max(0, c.k_sel - int((~unpinned).sum()))
    s[np.flatnonzero(unpinned)[::-1][:free - free // 2]] = np.finfo(np.float32).max
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="../shared/models/stories260K/stories260K.gguf")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--buffer", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=400)
    a = ap.parse_args()
    m = kvevict.Model(a.model)
    kw = dict(budget=a.budget, buffer=a.buffer, max_tokens=a.tokens, ignore_eos=True, threads=1)
    heads = m.n_layers * m.n_kv_heads
    print(f"model {os.path.basename(a.model.rstrip('/'))}: {m.n_layers} layers x {m.n_kv_heads} KV heads = "
          f"{heads} selector calls per round; B={a.budget} r={a.buffer}, {a.tokens} tokens, 1 thread; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    for builtin, mine in (("recency", py_recency), ("h2o", py_h2o)):
        t = {builtin: [], mine.name: []}
        for _ in range(a.reps):
            for p in (builtin, mine):
                out = m.generate("Once upon a time", policy=p, **kw)
                t[out.policy].append(out.score_ms / out.eviction_rounds)
                rounds, step_ms = out.eviction_rounds, out.decode_ms / out.decode_steps
        med = {k: statistics.median(v) for k, v in t.items()}
        for k, v in t.items():
            print(f"  {k:11s} score/round {med[k]:8.3f} ms [{min(v):.3f}-{max(v):.3f}]  "
                  f"= {1000 * med[k] / heads:7.1f} us per (layer, KV head)  ({rounds} rounds)")
        print(f"  ratio {mine.name}/{builtin}: {med[mine.name] / med[builtin]:.0f}x; "
              f"extra {med[mine.name] - med[builtin]:.3f} ms per round (a decode step takes {step_ms:.3f} ms; "
              f"a round comes every {a.buffer} steps)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
