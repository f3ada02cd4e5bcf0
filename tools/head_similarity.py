#!/usr/bin/python3
"""How alike are a reasoner's KV heads? Weight and attention-pattern similarity per layer.

For a GGUF written by tools/export_gguf.py (or a train_reasoner.py final.pt):
  - K / V weight cosine: per layer, the cosine between the flattened projection rows of every pair
    of KV heads (attn_k / attn_v rows [h * head_dim, (h + 1) * head_dim)), reported as the mean
    of |cos| over pairs and the largest |cos|. Independently initialised heads sit near 0
    (+-1/sqrt(head_dim * dim) at initialisation); copies of one head give 1.
  - attention-pattern overlap: the model reads held-out tasks of every family (`kvevict tasks gen`,
    seed 3000, teacher-forced BOS + problem + trace, PyTorch); for each KV head the attention
    distribution of a query position is the mean over that head's query heads. Overlap of two KV
    heads at a query = sum_j min(p(j), q(j)) (histogram intersection: 1 = the same distribution,
    0 = disjoint), averaged over every trace query position; top-8 Jaccard = |top8(p) & top8(q)| /
    |top8(p) | top8(q)|, the share of the keys each would most need that they need in common.
    Reported per layer as the mean over KV-head pairs. With one KV head nothing is compared.

Usage: /usr/bin/python3 tools/head_similarity.py --kvevict build/kvevict MODEL.gguf [--n 10] [--length 600]
Prints one Markdown table (a row per layer) and, with --json FILE, writes the numbers.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reasoner_model import BOS, encode, load_reasoner  # noqa: E402

FAMILIES = ["chain", "running", "once", "recall", "revisit"]


def weight_cosines(w, n_kv, head_dim):
    """w: [n_kv * head_dim, dim] -> (mean |cos|, max |cos|) over KV-head pairs, or None."""
    if n_kv < 2:
        return None
    heads = w.view(n_kv, head_dim * w.shape[1])
    heads = heads / heads.norm(dim=1, keepdim=True)
    cos = [abs(float(heads[i] @ heads[j])) for i, j in itertools.combinations(range(n_kv), 2)]
    return sum(cos) / len(cos), max(cos)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvevict", required=True)
    ap.add_argument("model", help="GGUF (export_gguf.py) or final.pt")
    ap.add_argument("--n", type=int, default=10, help="tasks per family")
    ap.add_argument("--length", type=int, default=600, help="trace tokens")
    ap.add_argument("--seed", type=int, default=3000)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_reasoner(args.model)
    c = model.c
    group = c.n_heads // c.n_kv_heads
    layers = []
    for layer in range(c.n_layers):
        b = model.blocks[layer]
        layers.append({"layer": layer, "k_cos": weight_cosines(b.wk.weight.detach(), c.n_kv_heads, c.head_dim),
                       "v_cos": weight_cosines(b.wv.weight.detach(), c.n_kv_heads, c.head_dim),
                       "pair_overlap": [0.0] * 0, "pair_jaccard": [], "queries": 0})
    pairs = list(itertools.combinations(range(c.n_kv_heads), 2))
    for rec in layers:
        rec["pair_overlap"] = [0.0] * len(pairs)
        rec["pair_jaccard"] = [0.0] * len(pairs)
    for fam in args.families.split(","):
        out = subprocess.run([args.kvevict, "tasks", "gen", "--family", fam, "--count", str(args.n), "--seed",
                              str(args.seed), "--length", str(args.length)], check=True, capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            t = json.loads(line)
            ids = torch.tensor([[BOS] + encode(t["problem"] + t["trace"])])
            first = 1 + len(t["problem"])
            attn = []
            with torch.no_grad():
                model(ids, attn_out=attn)
            for layer, att in enumerate(attn):
                # [n_heads, T, T] -> per KV head: mean over its query heads; trace queries only
                kv = att[0].view(c.n_kv_heads, group, att.shape[-1], att.shape[-1]).mean(1)[:, first:, :]
                rec = layers[layer]
                rec["queries"] += kv.shape[1]
                if not pairs:
                    continue
                top = kv.topk(8, dim=-1).indices
                for k, (i, j) in enumerate(pairs):
                    rec["pair_overlap"][k] += float(torch.minimum(kv[i], kv[j]).sum(-1).sum())
                    a = torch.zeros_like(kv[i], dtype=torch.bool).scatter_(-1, top[i], True)
                    bb = torch.zeros_like(kv[j], dtype=torch.bool).scatter_(-1, top[j], True)
                    inter = (a & bb).sum(-1).float()
                    union = (a | bb).sum(-1).float()
                    rec["pair_jaccard"][k] += float((inter / union).sum())
    print(f"{args.model}: {c.n_layers} layers, {c.n_heads} query heads, {c.n_kv_heads} KV heads, head size "
          f"{c.head_dim}; attention over {layers[0]['queries']} trace positions ({args.n} tasks x "
          f"{len(args.families.split(','))} families, ~{args.length} trace tokens, seed {args.seed})")
    print("| layer | K cosine mean / max | V cosine mean / max | attention overlap mean / max | top-8 Jaccard mean / max |")
    print("|---:|---|---|---|---|")

    def fmt(p):
        return "–" if p is None else f"{p[0]:.3f} / {p[1]:.3f}"
    for rec in layers:
        q = max(1, rec["queries"])
        rec["pair_overlap"] = [v / q for v in rec["pair_overlap"]]
        rec["pair_jaccard"] = [v / q for v in rec["pair_jaccard"]]
        ov = (sum(rec["pair_overlap"]) / len(pairs), max(rec["pair_overlap"])) if pairs else None
        jc = (sum(rec["pair_jaccard"]) / len(pairs), max(rec["pair_jaccard"])) if pairs else None
        rec["overlap"], rec["jaccard"] = ov, jc
        print(f"| {rec['layer']} | {fmt(rec['k_cos'])} | {fmt(rec['v_cos'])} | {fmt(ov)} | {fmt(jc)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "config": c.to_dict(), "layers": layers}, f, indent=1)


if __name__ == "__main__":
    main()
