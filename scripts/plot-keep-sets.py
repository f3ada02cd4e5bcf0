#!/usr/bin/env python3
"""Plots the keep-sets of two policies on the default model (models/reasoner) solving one chain
problem: for every eviction round (x) the positions each KV head of layer 0 still holds (y), from
kvevict's keep log (Model.generate(keep_log=True)). Writes a PNG (docs/keep-sets.png is its output).

Usage: python3 scripts/plot-keep-sets.py [OUT.png] [--policies random,h2o] [--budget 96] [--buffer 16]
Needs the kvevict package and matplotlib; without matplotlib it says so and exits 0 (nothing drawn).
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A chain problem of `kvevict tasks gen --family chain --seed 1 --length 200` (its first task; gold J).
PROBLEM = "NI\nFE\nMV\nLO\nEY\nWH\nZA\nJW\nTM\nAF\nHC\nKD\nYN\nCL\nOZ\nRK\nXJ\nDT\nVX\nIR\n?027R\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="out/keep-sets.png")
    ap.add_argument("--policies", default="random,h2o")
    ap.add_argument("--budget", type=int, default=96)
    ap.add_argument("--buffer", type=int, default=16)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: nothing drawn (pip install matplotlib)")
        return 0
    import kvevict

    m = kvevict.Model(str(ROOT / "models" / "reasoner" / "reasoner.gguf"))
    prompt_len = len(m.tokenize(PROBLEM))
    policies = a.policies.split(",")
    fig, axes = plt.subplots(1, len(policies), figsize=(5 * len(policies), 4), sharey=True, squeeze=False)
    for ax, policy in zip(axes[0], policies):
        out = m.generate(PROBLEM, policy=policy, budget=a.budget, buffer=a.buffer, max_tokens=400, seed=1,
                         keep_log=True)
        pos = out.keep_log["positions"]  # [rounds, layers, KV heads, B]
        n_seen = out.keep_log["n_seen"]
        for h in range(pos.shape[2]):
            x = [r + (h - (pos.shape[2] - 1) / 2) * 0.3 for r in range(pos.shape[0]) for _ in range(pos.shape[3])]
            ax.scatter(x, pos[:, 0, h, :].ravel(), s=2, label=f"KV head {h}")
        ax.plot(range(pos.shape[0]), n_seen, "k--", lw=0.8, label="tokens seen")
        ax.axhspan(0, prompt_len, color="0.9", zorder=0, label="prompt")
        answer = out.text.rsplit("boxed{", 1)[-1].rstrip("}") if "boxed{" in out.text else "-"
        ax.set_title(f"{policy}, B={a.budget}, r={a.buffer}: answer {answer} (gold J)")
        ax.set_xlabel("eviction round")
    axes[0][0].set_ylabel("kept position (layer 0)")
    axes[0][-1].legend(loc="upper left", fontsize=7, markerscale=3)
    fig.tight_layout()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=80)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
