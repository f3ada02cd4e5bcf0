#!/usr/bin/env python3
"""Where a recall value survives in the cache when the answer is written, and whether the answer
is right: separates "the policy evicted V" from "the model fails beside holes elsewhere".

For each of N recall (or revisit) tasks (`kvevict tasks gen`, seed 1000 as the main job), one
greedy rollout with `kvevict generate --keep-log-positions` under POLICY at budget B (r = 32, the
main job's), seed = the task's index, so each problem gets its own random draws, as in `kvevict
eval`, though not the same ones (eval derives each problem's stream from its id; `generate` runs one
sequence: with one seed for all, every task of a family would get the same keep-sets, and their
fixed-format traces would win or lose together). In the rollout,
V's digits are the tokens after each '&' that spell the gold value (copies the model wrote wrong
are not V); at the last eviction round before the answer, each (layer, KV head) cache either holds
one of those positions or not. Prints accuracy by how many caches hold V, and which caches hold it
in right and in wrong rollouts.

usage: tools/value_survival.py [--kvevict build/kvevict] [--model M] [--n 40] [--budget 256]
                               [--policy random] -- GEN_OPTIONS...
  e.g. tools/value_survival.py --policy rkv+prompt -- --family recall --steps 166 --depth 6 --restate 1
Needs the trace reasoner's vocabulary (tools/reasoner_model.py: one token per character).
Source: the keep-log of src/eval/keeplog.h; the tasks of src/tasks/generator.h.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reasoner_model import encode  # noqa: E402


def memo_value(trace):
    """V as the gold trace's memo line writes it: the digits after its first '&'."""
    at = trace.index("&") + 1
    end = at
    while end < len(trace) and trace[end].isdigit():
        end += 1
    return trace[at:end]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvevict", default=os.path.join(root, "build", "kvevict"))
    ap.add_argument("--model", default=os.path.join(root, "models", "trace-reasoner", "trace-reasoner.gguf"))
    ap.add_argument("--n", type=int, default=40, help="tasks (default 40)")
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--policy", default="random")
    ap.add_argument("gen", nargs=argparse.REMAINDER, help="-- then `kvevict tasks gen` options")
    a = ap.parse_args()
    gen = a.gen[1:] if a.gen[:1] == ["--"] else a.gen
    if "recall" not in gen and "revisit" not in gen:
        sys.exit("value_survival.py: give a recall or revisit family after --, e.g. -- --family recall --restate 1")
    if a.n < 1:
        sys.exit(f"--n {a.n}: must be >= 1")
    out = subprocess.run([a.kvevict, "tasks", "gen", *gen, "--count", str(a.n), "--seed", "1000"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"kvevict tasks gen {' '.join(gen)}: {out.stderr.strip()}")
    tasks = [json.loads(line) for line in out.stdout.splitlines()]
    by_count = collections.defaultdict(lambda: [0, 0])
    by_cache = {True: collections.Counter(), False: collections.Counter()}
    with tempfile.TemporaryDirectory() as tmp:
        for k, t in enumerate(tasks):
            # generate drops one trailing newline of -f (as llama.cpp); the problem keeps its own.
            with open(os.path.join(tmp, "p.txt"), "w") as f:
                f.write(t["problem"] + "\n")
            log = os.path.join(tmp, "keep.jsonl")
            r = subprocess.run([a.kvevict, "generate", "-m", a.model, "-f", os.path.join(tmp, "p.txt"),
                                "--policy", a.policy, "-B", str(a.budget), "-r", "32", "--temp", "0", "-n", "1900",
                                "--keep-log", log, "--keep-log-positions", "-t", "1", "-s", str(k)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"kvevict generate (task {k}): {r.stderr.strip()}")
            text = r.stdout[len(t["problem"]):] if r.stdout.startswith(t["problem"]) else r.stdout
            gold_v = memo_value(t["trace"])
            right = "\\boxed{" + t["answer"] + "}" in text
            box = text.rfind("\\boxed{")
            body = text[:box] if box >= 0 else text
            prompt = 1 + len(encode(t["problem"]))  # BOS + problem: one token per character
            v_pos = {prompt + len(encode(body[:j + 1])) + d
                     for j in range(len(body)) if body[j] == "&" and body[j + 1:j + 1 + len(gold_v)] == gold_v
                     for d in range(len(gold_v))}
            answer_at = prompt + len(encode(body))
            last = {}
            with open(log) as f:
                for line in f:
                    row = json.loads(line)
                    if row["n_seen"] <= answer_at:
                        last[row["layer"]] = row
            where = [f"L{layer}H{h}" for layer, row in sorted(last.items())
                     for h, kept in enumerate(row["positions"]) if v_pos & set(kept)]
            by_count[len(where)][0] += right
            by_count[len(where)][1] += 1
            by_cache[right].update(where)
    caches = sum(len(row["positions"]) for row in last.values()) if last else 0
    print(f"{os.path.basename(a.model)} | {' '.join(gen)} | {a.policy} B = {a.budget} | {a.n} tasks")
    print(f"caches (of {caches} = layers x KV heads) holding a digit of V at the answer -> right / rollouts")
    for c in sorted(by_count):
        print(f"  {c}: {by_count[c][0]}/{by_count[c][1]}")
    none = by_count.get(0, [0, 0])
    some = [sum(v[0] for c, v in by_count.items() if c), sum(v[1] for c, v in by_count.items() if c)]
    print(f"no cache holds V: {none[0]}/{none[1]} right; some cache holds V: {some[0]}/{some[1]} right")
    for right in (True, False):
        print(f"caches holding V in {'right' if right else 'wrong'} rollouts:", dict(sorted(by_cache[right].items())))


if __name__ == "__main__":
    main()
