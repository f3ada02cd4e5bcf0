#!/usr/bin/python3
"""Which skill does a reasoner get wrong? Teacher-forced accuracy per token kind on held-out tasks.

For a GGUF written by tools/export_gguf.py (or a train_reasoner.py final.pt): the model reads
held-out tasks (`kvevict tasks gen`, seed 1000 by default: the evaluation's, not training's 100-107)
teacher-forced, BOS + problem + trace, and for every trace character predicts the next one; each
character is classed by train_reasoner.token_kinds (lookup, digit, sum, memo, copy, recall, jump,
end, go, hold, count, resume, ...: that function's docstring says what each is). Accuracy per kind =
right argmax predictions / characters of that kind, with the count, so a kind seen a few times is
read as such. Greedy runs fail where one of these is wrong once; this says which one, without
the failures that follow the first wrong character (tools/train-trace-reasoner.sh's variants:
models/trace-reasoner/MODEL_CARD.md, "Next").

Usage: /usr/bin/python3 tools/kind_accuracy.py --kvevict build/kvevict MODEL.gguf [MODEL2.gguf ...]
         [--n 30] [--set "recall --steps 166 --depth 6 --restate 2"] ...
Prints one Markdown table: a row per kind, a column per model (accuracy and count).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reasoner_model import BOS, encode, load_reasoner  # noqa: E402
from train_reasoner import KIND_NAMES, token_kinds  # noqa: E402

DEFAULT_SETS = ["recall --steps 166 --depth 6 --restate 1", "recall --steps 166 --depth 6 --restate 2",
                "recall --steps 166 --depth 6 --restate 4", "revisit --steps 166 --depth 6 --restate 4",
                "chain --length 600", "running --length 600", "once --length 600"]


def kind_counts(model, tasks):
    """{kind name: [right, total]} over the trace characters of `tasks` (dicts with problem, trace,
    family), teacher-forced."""
    right = torch.zeros(len(KIND_NAMES))
    total = torch.zeros(len(KIND_NAMES))
    with torch.no_grad():
        for t in tasks:
            p = [BOS] + encode(t["problem"])
            seq = p + encode(t["trace"])
            ids = torch.tensor([seq[:-1]])
            pred = model(ids).argmax(-1)[0]
            # Trace character k is predicted at position len(p) - 1 + k.
            first = len(p) - 1
            kinds = torch.tensor(token_kinds(t["trace"], t["family"]))
            ok = (pred[first:] == torch.tensor(seq[first + 1:])).float()
            right.index_add_(0, kinds, ok)
            total.index_add_(0, kinds, torch.ones_like(ok))
    return {name: [int(right[i]), int(total[i])] for i, name in enumerate(KIND_NAMES)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvevict", required=True, help="path to the built kvevict binary (writes the tasks)")
    ap.add_argument("models", nargs="+", help="GGUF (export_gguf.py) or final.pt files")
    ap.add_argument("--n", type=int, default=30, help="tasks per set")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--set", action="append", dest="sets",
                    help="`kvevict tasks gen` options after --family (repeatable; default: recall R = 1/2/4 and "
                         "revisit R = 4 at 166 steps, chain, running, once at length 600)")
    ap.add_argument("--json", help="also write the counts here")
    args = ap.parse_args()
    if args.n < 1:
        sys.exit(f"--n {args.n}: must be >= 1")
    torch.set_num_threads(1)
    tasks = []
    for spec in args.sets or DEFAULT_SETS:
        out = subprocess.run([args.kvevict, "tasks", "gen", "--family", *shlex.split(spec), "--count", str(args.n),
                              "--seed", str(args.seed)], check=True, capture_output=True, text=True).stdout
        tasks += [json.loads(line) for line in out.splitlines() if line]
    counts = {}
    for path in args.models:
        counts[path] = kind_counts(load_reasoner(path), tasks)
    names = [os.path.basename(os.path.dirname(p)) + "/" + os.path.basename(p) for p in args.models]
    print(f"Teacher-forced accuracy per token kind: {len(tasks)} tasks ({args.n} per set, seed {args.seed}): "
          + "; ".join(args.sets or DEFAULT_SETS))
    print()
    print("| kind | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for kind in KIND_NAMES:
        cells = []
        for path in args.models:
            r, n = counts[path][kind]
            cells.append(f"{r / n:.3f} ({n})" if n else "–")
        print(f"| {kind} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, "n": args.n, "sets": args.sets or DEFAULT_SETS, "counts": counts}, f, indent=1)


if __name__ == "__main__":
    main()
