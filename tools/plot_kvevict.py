#!/usr/bin/env python3
"""PNG figures for kvevict reports (called by `kvevict eval`, `merge` and `perplexity --plot`).

  plot_kvevict.py eval SUMMARY_JSON OUT_DIR
      accuracy_vs_budget.png: accuracy per policy vs budget B, bars = 95% problem-clustered
        bootstrap CI; a policy that does not evict (full) is a horizontal line with its CI band.
      length_vs_budget.png: mean generated tokens per rollout vs budget.
  plot_kvevict.py perplexity NLL_CSV OUT_PNG [--title T] [--smooth W]
      Two panels per policy@budget: running perplexity exp(mean NLL of tokens 1..t) vs position t,
      and the per-position NLL smoothed by a centred moving average of W tokens (0: N/50), the
      layout of StreamingLLM's perplexity-vs-length figure (arXiv 2309.17453, Fig. 3).

Input formats are kvevict's own: summary.json from eval/summary.cpp, and the CSV written by
`kvevict perplexity` (policy,budget,position,token,nll). Needs matplotlib (Debian:
python3-matplotlib) and numpy (a dependency of it).
"""
import argparse
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_eval(summary_path, out_dir):
    with open(summary_path, encoding="utf-8") as f:
        summary = json.load(f)
    cells = [c for c in summary["cells"] if c["rollouts"] > 0]
    settings = summary["settings"]
    title = "{} on {} {} ({} problems, {} rollouts)".format(
        settings["model"]["file"], settings["tasks"]["format"], settings["tasks"]["file"], settings["tasks"]["count"],
        settings["rollouts"])
    budgets = sorted({c["budget"] for c in cells if c["budget"] is not None})
    policies = []
    for c in cells:
        if c["policy"] not in policies:
            policies.append(c["policy"])

    def draw(value, err, ylabel, fname, ylim=None):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        span = (min(budgets) / 1.3, max(budgets) * 1.3) if budgets else (0.5, 2)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, pol in enumerate(policies):
            rows = [c for c in cells if c["policy"] == pol]
            color = colors[i % len(colors)]
            if rows[0]["budget"] is None:  # no eviction: one value for every budget
                c = rows[0]
                ax.axhline(value(c), color=color, linestyle="--", label=pol)
                if err:
                    lo, hi = err(c)
                    ax.axhspan(lo, hi, color=color, alpha=0.12)
                continue
            rows.sort(key=lambda c: c["budget"])
            xs = [c["budget"] for c in rows]
            ys = [value(c) for c in rows]
            if err:
                los = [ys[k] - err(c)[0] for k, c in enumerate(rows)]
                his = [err(c)[1] - ys[k] for k, c in enumerate(rows)]
                ax.errorbar(xs, ys, yerr=[los, his], marker="o", capsize=4, color=color, label=pol)
            else:
                ax.plot(xs, ys, marker="o", color=color, label=pol)
        if budgets:
            ax.set_xscale("log", base=2)
            ax.set_xticks(budgets)
            ax.set_xticklabels([str(b) for b in budgets])
            ax.set_xlim(*span)
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_xlabel("budget B (slots per layer and KV head)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        print("plot: wrote " + path, file=sys.stderr)

    top = max([c["accuracy_ci"]["hi"] for c in cells] + [0.0])
    draw(lambda c: c["accuracy"], lambda c: (c["accuracy_ci"]["lo"], c["accuracy_ci"]["hi"]),
         "accuracy (95% bootstrap CI)", "accuracy_vs_budget.png", (-0.02, min(1.02, max(0.1, 1.15 * top))))
    draw(lambda c: c["mean_generated"], None, "mean generated tokens per rollout", "length_vs_budget.png")


def plot_perplexity(csv_path, out_png, title, smooth):
    series = {}
    with open(csv_path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            label = row["policy"] + ("@" + row["budget"] if row["budget"] else "")
            series.setdefault(label, []).append(float(row["nll"]))
    if not series:
        sys.exit("plot: {} holds no rows".format(csv_path))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.8), sharex=True)
    for label, nll in series.items():
        nll = np.asarray(nll)
        pos = np.arange(1, len(nll) + 1)
        top.plot(pos, np.exp(np.cumsum(nll) / pos), label=label, linewidth=1.2)
        w = smooth if smooth > 0 else max(1, len(nll) // 50)
        w = min(w, len(nll))
        kernel = np.ones(w) / w
        smoothed = np.convolve(nll, kernel, mode="valid")
        bottom.plot(pos[w // 2: w // 2 + len(smoothed)], smoothed, label=label, linewidth=1.0)
    top.set_yscale("log")
    top.set_ylabel("perplexity of tokens 1..t")
    top.set_title(title, fontsize=9)
    top.grid(alpha=0.3, which="both")
    top.legend(fontsize=8, ncol=2)
    bottom.set_ylabel("NLL at position t (moving average, {} tok)".format(
        smooth if smooth > 0 else "N/50"))
    bottom.set_xlabel("position t (tokens)")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    print("plot: wrote " + out_png, file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("summary")
    e.add_argument("out_dir")
    p = sub.add_parser("perplexity")
    p.add_argument("csv")
    p.add_argument("png")
    p.add_argument("--title", default="")
    p.add_argument("--smooth", type=int, default=0)
    a = ap.parse_args()
    if a.cmd == "eval":
        plot_eval(a.summary, a.out_dir)
    else:
        plot_perplexity(a.csv, a.png, a.title, a.smooth)


if __name__ == "__main__":
    main()
