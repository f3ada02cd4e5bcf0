#!/usr/bin/python3
"""Is the prompt needed throughout? Teacher-forced lookups of a trained reasoner with and without
the prompt's fact lines visible.

For held-out tasks (`kvevict tasks gen`, seed 2000) the model reads BOS + problem + gold trace in
one pass (PyTorch, the training code's model, independent of kvevict's engine). Lookup tokens (Y
of "cccX=Y"; tasks/generator.h) whose fact the trace has already spelled out as "X=Y" on an
earlier line (so the trace could answer them) are scored under two attention masks:
  full         causal attention, as trained;
  prompt-hidden  the same, but those lines cannot attend to the fact lines of the prompt (BOS,
               the question line and the whole trace stay visible).
If accuracy stays high when hidden, the model reads the facts from the trace; if it falls to
chance (1 / cycle length), the prompt is needed at every step. (tests/trace_ablation_test.cpp
measures the same through kvevict's engine, greedy, end to end.)

Usage: /usr/bin/python3 tools/ablate_prompt.py --kvevict build/kvevict --weights RUN/final.pt|MODEL.gguf
       [--n 50] [--length 600] [--facts 20] [--families chain,running,once,recall,revisit]
"""

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reasoner_model import BOS, encode, load_reasoner  # noqa: E402
from train_reasoner import KIND_LOOKUP, token_kinds  # noqa: E402


def lookup_positions(trace):
    """Trace offsets of the letter lookups (Y of "cccX=Y", as train_reasoner.token_kinds marks
    them) whose "X=Y" already appears earlier in the trace."""
    out = []
    for i, k in enumerate(token_kinds(trace)):
        if k == KIND_LOOKUP and trace[i - 2:i + 1] in trace[:i - 2]:
            out.append(i)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvevict", required=True)
    ap.add_argument("--weights", required=True, help="final.pt written by tools/train_reasoner.py, or a GGUF")
    ap.add_argument("--families", default="chain,running,once,recall,revisit")
    ap.add_argument("--n", type=int, default=50, help="tasks per family")
    ap.add_argument("--length", type=int, default=600, help="trace tokens")
    ap.add_argument("--facts", type=int, default=20, help="facts M per problem")
    ap.add_argument("--seed", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_reasoner(args.weights)
    print("| family | lookups scored | full | prompt hidden |")
    print("|---|---:|---:|---:|")
    for fam in args.families.split(","):
        out = subprocess.run([args.kvevict, "tasks", "gen", "--family", fam, "--count", str(args.n), "--seed",
                              str(args.seed), "--length", str(args.length), "--facts", str(args.facts)], check=True, capture_output=True,
                             text=True).stdout
        right = {"full": 0, "hidden": 0}
        count = 0
        facts = 0
        for line in out.splitlines():
            t = json.loads(line)
            facts = t["length"]["facts"]
            ids = [BOS] + encode(t["problem"]) + encode(t["trace"])
            p = 1 + len(t["problem"])          # first trace position
            fact_end = 1 + 3 * facts           # fact lines occupy positions 1 .. fact_end - 1
            letters = lookup_positions(t["trace"])
            T = len(ids) - 1
            x = torch.tensor([ids[:-1]])
            y = torch.tensor(ids[1:])
            hide = torch.zeros(1, T, T, dtype=torch.bool)
            # Rows from the start of the first scored line on (its "cccX=" included) cannot see
            # the fact lines: the line starts 5 characters before its Y.
            first = p + min(letters) - 5 if letters else T
            hide[0, first:, 1:fact_end] = True
            with torch.no_grad():
                pred_full = model(x)[0].argmax(-1)
                pred_hid = model(x, hide)[0].argmax(-1)
            for o in letters:
                j = p + o - 1                  # row whose prediction is trace[o]
                count += 1
                right["full"] += int(pred_full[j] == y[j])
                right["hidden"] += int(pred_hid[j] == y[j])
        if count:
            print(f"| {fam} | {count} | {right['full'] / count:.3f} | {right['hidden'] / count:.3f} |")


if __name__ == "__main__":
    main()
