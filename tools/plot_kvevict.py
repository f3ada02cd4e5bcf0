#!/usr/bin/env python3
"""PNG figures for kvevict reports (called by `kvevict eval`, `merge` and `perplexity --plot`).

  plot_kvevict.py eval SUMMARY_JSON OUT_DIR
      accuracy_vs_budget.png: accuracy per policy vs budget B, bars = 95% CI; a policy that does
        not evict (full) is a horizontal line with its CI band.
      length_vs_budget.png: mean generated tokens per rollout vs budget.
  plot_kvevict.py perplexity NLL_CSV OUT_PNG [--title T] [--smooth W] [--context N]
      Two panels: running perplexity exp(mean NLL of tokens 1..t) vs position t, and the
      per-position NLL smoothed by a centred moving average of W tokens (0: N/50), the layout of
      StreamingLLM's perplexity-vs-length figure (arXiv 2309.17453, Fig. 3). --context N draws a
      dotted line at the model's stated context.

Readability rules (the same in every figure, so one policy looks the same everywhere): each
policy has one colour and marker, fixed by its name (STYLE below; unknown names get a stable
colour from their name); a `+prompt` variant is dashed in its base policy's colour with an open
marker; budgets of one policy differ by line style only. Legends sit outside the axes. In the
accuracy plot the points of different policies at one budget are spread sideways (so CIs do not
sit on each other), and with more than 8 policies the figure has one panel per family (random
and baselines, scored selectors, scored selectors with the prompt pinned), each with `full` as
reference.

Input formats are kvevict's own: summary.json from eval/summary.cpp, and the CSV written by
`kvevict perplexity` (policy,budget,position,token,nll). Needs matplotlib (Debian:
python3-matplotlib) and numpy (a dependency of it).
"""
import argparse
import csv
import json
import os
import sys
import zlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# One colour (colour-blind-safe where possible: Okabe-Ito first, then tab20) and marker per
# registered policy. A new policy without an entry gets a stable colour from its name.
STYLE = {
    "full": ("#000000", "s"),
    "random": ("#D55E00", "o"),
    "random-unprotected": ("#E69F00", "v"),
    "random-shared": ("#CC79A7", "D"),
    "random-beacon": ("#882255", "P"),
    "recency": ("#999999", "<"),
    "streaming": ("#56B4E9", ">"),
    "snapkv": ("#0072B2", "^"),
    "rkv": ("#009E73", "p"),
    "vase": ("#8C564B", "h"),
    "h2o": ("#9467BD", "X"),
    "tova": ("#BCBD22", "*"),
    "triattention": ("#17BECF", "d"),
}
FALLBACK_COLOURS = list(plt.get_cmap("tab20").colors)
FALLBACK_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*", "h", "p"]
LINESTYLES = ["-", "--", ":", "-."]
FAMILIES = [
    ("random and baselines", lambda n: n in ("full", "recency", "streaming") or n.startswith("random")),
    ("scored selectors", lambda n: not n.endswith("+prompt")),
    ("scored selectors, prompt pinned (+prompt)", lambda n: n.endswith("+prompt")),
]


def base_name(policy):
    return policy[: -len("+prompt")] if policy.endswith("+prompt") else policy


def style(policy):
    """(colour, marker, linestyle, marker face) of a policy name, the same in every figure."""
    base = base_name(policy)
    if base in STYLE:
        colour, marker = STYLE[base]
    else:
        h = zlib.crc32(base.encode())
        colour, marker = FALLBACK_COLOURS[h % len(FALLBACK_COLOURS)], FALLBACK_MARKERS[h % len(FALLBACK_MARKERS)]
    pinned = policy.endswith("+prompt") and base != policy
    return colour, marker, "--" if pinned else "-", "none" if pinned else colour


def family_of(policy):
    for k, (_, member) in enumerate(FAMILIES):
        if member(policy):
            return k
    return len(FAMILIES) - 1


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
    evicting = [p for p in policies if any(c["budget"] is not None for c in cells if c["policy"] == p)]
    reference = [p for p in policies if p not in evicting]
    if len(policies) > 8:
        groups = [[] for _ in FAMILIES]
        for p in evicting:
            groups[family_of(p)].append(p)
        panels = [(FAMILIES[k][0], reference + g) for k, g in enumerate(groups) if g]
    else:
        panels = [(None, policies)]

    def draw(value, err, ylabel, fname, ylim=None):
        n = len(panels)
        fig, axes = plt.subplots(1, n, figsize=(4.6 * n + 2.2, 4.4), sharey=True, squeeze=False)
        for ax, (name, members) in zip(axes[0], panels):
            movers = [p for p in members if p in evicting]
            for pol in members:
                rows = sorted((c for c in cells if c["policy"] == pol), key=lambda c: c["budget"] or 0)
                colour, marker, ls, face = style(pol)
                if rows[0]["budget"] is None:  # no eviction: one value for every budget
                    c = rows[0]
                    ax.axhline(value(c), color=colour, linestyle=":", linewidth=1.5, label=pol + " (no eviction)")
                    if err:
                        lo, hi = err(c)
                        ax.axhspan(lo, hi, color=colour, alpha=0.08)
                    continue
                # Spread policies sideways around each budget (log2 axis: +-0.25 octave in all).
                k = movers.index(pol)
                shift = 2 ** (0.5 * ((k + 0.5) / len(movers) - 0.5)) if len(movers) > 1 else 1.0
                xs = [c["budget"] * shift for c in rows]
                ys = [value(c) for c in rows]
                kw = dict(marker=marker, color=colour, linestyle=ls, markerfacecolor=face, markersize=6,
                          linewidth=1.3, label=pol)
                if err:
                    los = [max(0.0, ys[i] - err(c)[0]) for i, c in enumerate(rows)]
                    his = [max(0.0, err(c)[1] - ys[i]) for i, c in enumerate(rows)]
                    ax.errorbar(xs, ys, yerr=[los, his], capsize=3, elinewidth=1.0, **kw)
                else:
                    ax.plot(xs, ys, **kw)
            if budgets:
                ax.set_xscale("log", base=2)
                ax.set_xticks(budgets)
                ax.set_xticklabels([str(b) for b in budgets])
                ax.minorticks_off()
                ax.set_xlim(min(budgets) / 1.6, max(budgets) * 1.6)
            if ylim:
                ax.set_ylim(*ylim)
            ax.set_xlabel("budget B (slots per layer and KV head)")
            ax.grid(alpha=0.3)
            if name:
                ax.set_title(name, fontsize=9)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        axes[0][0].set_ylabel(ylabel)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        print("plot: wrote " + path, file=sys.stderr)

    def ci(c):
        i = c.get("accuracy_ci") or {}
        return (i.get("lo", c["accuracy"]), i.get("hi", c["accuracy"]))

    top = max([ci(c)[1] for c in cells] + [0.0])
    draw(lambda c: c["accuracy"], ci, "accuracy (95% CI)", "accuracy_vs_budget.png",
         (-0.03, min(1.03, max(0.1, 1.15 * top))))
    draw(lambda c: c["mean_generated"], None, "mean generated tokens per rollout", "length_vs_budget.png")


def plot_perplexity(csv_path, out_png, title, smooth, context):
    series = {}
    with open(csv_path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            series.setdefault((row["policy"], row["budget"]), []).append(float(row["nll"]))
    if not series:
        sys.exit("plot: {} holds no rows".format(csv_path))
    budgets = sorted({int(b) for _, b in series if b})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9.0, 7.0), sharex=True)
    n_max = max(len(v) for v in series.values())
    for (policy, budget), nll in series.items():
        nll = np.asarray(nll)
        pos = np.arange(1, len(nll) + 1)
        colour, _, ls, _ = style(policy)
        if budget:  # budgets of one policy: same colour, line style by budget
            ls = LINESTYLES[budgets.index(int(budget)) % len(LINESTYLES)]
        label = policy + (" B={}".format(budget) if budget else "")
        # The reference (no eviction) is drawn on top, thicker, so curves under it stay visible.
        kw = dict(color=colour, linestyle=ls, label=label, alpha=0.9,
                  linewidth=2.0 if not budget else 1.2, zorder=3 if not budget else 2)
        top.plot(pos, np.exp(np.cumsum(nll) / pos), **kw)
        w = smooth if smooth > 0 else max(1, len(nll) // 50)
        w = min(w, len(nll))
        smoothed = np.convolve(nll, np.ones(w) / w, mode="valid")
        bottom.plot(pos[w // 2: w // 2 + len(smoothed)], smoothed, **kw)
    if context and context < n_max:
        for ax in (top, bottom):
            ax.axvline(context, color="#444444", linestyle=":", linewidth=1.2, zorder=1)
        top.annotate("model's stated context ({})".format(context), xy=(context, 1), xycoords=("data", "axes fraction"),
                     xytext=(4, -12), textcoords="offset points", fontsize=8, color="#444444")
    top.set_yscale("log")
    top.set_ylabel("perplexity of tokens 1..t")
    top.set_title(title, fontsize=9)
    top.grid(alpha=0.3, which="both")
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    bottom.set_ylabel("NLL at position t (moving average, {} tok)".format(smooth if smooth > 0 else "N/50"))
    bottom.set_xlabel("position t (tokens)")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120, bbox_inches="tight")
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
    p.add_argument("--context", type=int, default=0)
    a = ap.parse_args()
    if a.cmd == "eval":
        plot_eval(a.summary, a.out_dir)
    else:
        plot_perplexity(a.csv, a.png, a.title, a.smooth, a.context)


if __name__ == "__main__":
    main()
