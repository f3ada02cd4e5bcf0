#!/usr/bin/python3
"""Tables and plots for the docs/reports/ scripts, from `kvevict eval` output folders.

Usage:
    report-lib.py table OUT.md PNG TITLE LABEL=DIR [LABEL=DIR ...]
        For each DIR (an eval output folder with summary.csv), one table row per (policy) and one
        column per budget: accuracy and its 95% CI; when the runs checked the once-stated fact
        (fact_kept_* columns), a second table with accuracy split by whether its slot was kept.
        Draws accuracy vs budget per policy, one panel per LABEL, into PNG. Env REPORT_POLICIES
        (comma-separated) keeps only those policies.
Reads only summary.csv (written by kvevict eval, eval/summary.h); /usr/bin/python3 with matplotlib.
"""

import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(dir_):
    with open(os.path.join(dir_, "summary.csv")) as f:
        return list(csv.DictReader(f))


def table(out_md, png, title, runs):
    md = []
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.2), squeeze=False)
    for (label, dir_), ax in zip(runs, axes[0]):
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # up to 20 distinct policies
        rows = read(dir_)
        budgets = sorted({int(r["budget"]) for r in rows if r["budget"]})
        full = [r for r in rows if not r["budget"]]
        only = [p for p in os.environ.get("REPORT_POLICIES", "").split(",") if p]
        policies = []
        for r in rows:
            if r["budget"] and r["policy"] not in policies and (not only or r["policy"] in only):
                policies.append(r["policy"])
        cell = {(r["policy"], int(r["budget"])): r for r in rows if r["budget"]}
        # The interval method is read from the CSV (older runs: bootstrap; now Wilson), never assumed.
        method = rows[0].get("accuracy_ci_method") or "bootstrap"
        md.append(f"**{label}** (`{dir_}`; {rows[0]['expected_rollouts']} problems per cell"
                  + (f"; full = {float(full[0]['accuracy']):.2f}" if full else "")
                  + f"; accuracy [95% {method} interval])\n")
        md.append("| policy | " + " | ".join(f"B = {b}" for b in budgets) + " |")
        md.append("|---|" + "---|" * len(budgets))
        for p in policies:
            cells = []
            for b in budgets:
                r = cell.get((p, b))
                cells.append(f"{float(r['accuracy']):.2f} [{float(r['accuracy_lo']):.2f}, {float(r['accuracy_hi']):.2f}]"
                             if r and int(r["rollouts"]) > 0 else "–")
            md.append(f"| {p} | " + " | ".join(cells) + " |")
            ys = [float(cell[(p, b)]["accuracy"]) if (p, b) in cell else float("nan") for b in budgets]
            ax.plot(budgets, ys, marker="o", label=p, ls="--" if "+prompt" in p or p in ("random", "random-shared",
                                                                                            "random-beacon", "triattention") else "-")
        if full:
            ax.axhline(float(full[0]["accuracy"]), color="k", lw=0.8, label="full")
        ax.set_title(label)
        ax.set_xlabel("budget B")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xticks(budgets)
        md.append("")
        if any(int(r.get("fact_kept_rollouts") or 0) + int(r.get("fact_lost_rollouts") or 0) for r in rows):
            md.append(f"Fact stated once ({label}): accuracy when its slot was still cached at the end by some "
                      "(layer, KV head) vs when it was gone — kept: right/rollouts, lost: right/rollouts\n")
            md.append("| policy | " + " | ".join(f"B = {b}" for b in budgets) + " |")
            md.append("|---|" + "---|" * len(budgets))
            for p in policies:
                cells = []
                for b in budgets:
                    r = cell.get((p, b))
                    if not r:
                        cells.append("–")
                        continue
                    cells.append(f"kept {r['fact_kept_correct']}/{r['fact_kept_rollouts']}, "
                                 f"lost {r['fact_lost_correct']}/{r['fact_lost_rollouts']}")
                md.append(f"| {p} | " + " | ".join(cells) + " |")
            md.append("")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="center right")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(png, dpi=100)
    with open(out_md, "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 6 or sys.argv[1] != "table":
        sys.exit(__doc__)
    table(sys.argv[2], sys.argv[3], sys.argv[4], [a.split("=", 1) for a in sys.argv[5:]])
