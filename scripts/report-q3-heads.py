#!/usr/bin/python3
"""Tables and plots of report Q3 (heads and GQA, docs/reports/q3-heads.md) from `kvevict eval`
output folders made by scripts/report-q3-heads.sh.

Usage:
    report-q3-heads.py GRID OUTDIR
        GRID holds one folder per variant (kv1, kv2, kv4), each with one eval folder per family
        (chain, running, once: prompt pinned) and FAMILY-unpinned (--no-protect-prompt).
        Writes OUTDIR/tables.md (accuracy with 95% Wilson intervals, from summary.csv),
        OUTDIR/paired.md (random vs random-shared, paired per problem, exact two-sided sign
        test), OUTDIR/accuracy.csv (every cell), OUTDIR/independence.png, OUTDIR/scored.png,
        OUTDIR/seeds.md (random vs random-shared over eval seeds 1-3 where FAMILY-unpinned-seedS
        folders exist), OUTDIR/compute.txt (per variant, main grid only: rollouts and their summed prefill + decode + round time, s;
        unlike wall time this does not depend on how often a run was resumed).
Reads summary.csv and rollouts.jsonl (written by kvevict eval, eval/summary.h); /usr/bin/python3
with matplotlib.
"""

import csv
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VARIANTS = [("kv1", "MQA, 1 KV head"), ("kv2", "GQA, 2 KV heads"), ("kv4", "MHA, 4 KV heads")]
FAMILIES = ["chain", "running", "once"]
MODES = [("", "prompt pinned"), ("-unpinned", "prompt not pinned")]
COLORS = {"kv1": "tab:red", "kv2": "tab:blue", "kv4": "tab:green"}


def summary(dir_):
    with open(os.path.join(dir_, "summary.csv")) as f:
        return list(csv.DictReader(f))


def rollouts(dir_):
    """{(policy, budget or None): {problem_index: correct}} (one rollout per problem)."""
    out = {}
    with open(os.path.join(dir_, "rollouts.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            out.setdefault((r["policy"], r["budget"]), {})[r["problem_index"]] = bool(r["correct"])
    return out


def sign_p(pos, neg):
    """Exact two-sided sign test on the discordant pairs (binomial, p = 1/2)."""
    n = pos + neg
    if n == 0:
        return 1.0
    k = min(pos, neg)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def wilson(k, n, z=1.959963984540054):
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def main(grid, outdir):
    os.makedirs(outdir, exist_ok=True)
    cells = []  # dicts: variant, family, mode, policy, budget, right, n, acc, lo, hi
    for v, _ in VARIANTS:
        for fam in FAMILIES:
            for suffix, mode in MODES:
                d = os.path.join(grid, v, fam + suffix)
                for r in summary(d):
                    n = int(r["rollouts"])
                    right = round(float(r["accuracy"]) * n)
                    cells.append(dict(variant=v, family=fam, mode=mode, policy=r["policy"],
                                      budget=int(r["budget"]) if r["budget"] else None, right=right, n=n,
                                      acc=float(r["accuracy"]), lo=float(r["accuracy_lo"]), hi=float(r["accuracy_hi"]),
                                      kept=r.get("fact_kept_rollouts", ""), kept_right=r.get("fact_kept_correct", ""),
                                      lost=r.get("fact_lost_rollouts", ""), lost_right=r.get("fact_lost_correct", "")))
    compute = []
    for v, _ in VARIANTS:
        n, ms = 0, 0.0
        for fam in FAMILIES:
            for suffix, _ in MODES:
                with open(os.path.join(grid, v, fam + suffix, "rollouts.jsonl")) as f:
                    for line in f:
                        r = json.loads(line)
                        n += 1
                        ms += r["prefill_ms"] + r["decode_ms"] + r["score_ms"] + r["compact_ms"]
        compute.append(f"{v}: {n} rollouts, {ms / 1000:.0f} s of prefill + decode + eviction rounds")
    with open(os.path.join(outdir, "compute.txt"), "w") as f:
        f.write("; ".join(compute) + "\n")
    with open(os.path.join(outdir, "accuracy.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(cells[0].keys()))
        w.writeheader()
        w.writerows(cells)

    def get(v, fam, mode, pol, b):
        for c in cells:
            if (c["variant"], c["family"], c["mode"], c["policy"], c["budget"]) == (v, fam, mode, pol, b):
                return c
        return None

    md = []
    for suffix, mode in MODES:
        for fam in FAMILIES:
            rows = [c for c in cells if c["family"] == fam and c["mode"] == mode]
            budgets = sorted({c["budget"] for c in rows if c["budget"] is not None})
            policies = []
            for c in rows:
                if c["budget"] is not None and c["policy"] not in policies:
                    policies.append(c["policy"])
            n = rows[0]["n"]
            fulls = ", ".join(f"{v} {get(v, fam, mode, 'full', None)['acc']:.2f}" for v, _ in VARIANTS)
            md.append(f"**{fam}, {mode}** ({n} problems per cell; full cache: {fulls})\n")
            md.append("| policy | KV heads | " + " | ".join(f"B = {b}" for b in budgets) + " |")
            md.append("|---|---|" + "---|" * len(budgets))
            for p in policies:
                for v, _ in VARIANTS:
                    cs = []
                    for b in budgets:
                        c = get(v, fam, mode, p, b)
                        cs.append(f"{c['acc']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}]" if c else "–")
                    md.append(f"| {p} | {v[2:]} | " + " | ".join(cs) + " |")
            md.append("")
    with open(os.path.join(outdir, "tables.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    # Paired random vs random-shared: same problems, same budget, same model.
    pm = ["| KV heads | mode | family | B | random | random-shared | random right only | shared right only | sign p |",
          "|---|---|---|---|---|---|---|---|---|"]
    pooled = {}
    for v, _ in VARIANTS:
        for suffix, mode in MODES:
            for fam in FAMILIES:
                ro = rollouts(os.path.join(grid, v, fam + suffix))
                budgets = sorted({b for (p, b) in ro if p == "random" and b is not None})
                for b in budgets:
                    a, s = ro[("random", b)], ro[("random-shared", b)]
                    common = sorted(set(a) & set(s))
                    pos = sum(1 for i in common if a[i] and not s[i])
                    neg = sum(1 for i in common if s[i] and not a[i])
                    ka, ks = sum(a[i] for i in common), sum(s[i] for i in common)
                    pm.append(f"| {v[2:]} | {mode} | {fam} | {b} | {ka}/{len(common)} | {ks}/{len(common)} | {pos} | {neg} | "
                              f"{sign_p(pos, neg):.3g} |")
                    t = pooled.setdefault((v, mode), [0, 0, 0, 0, 0])
                    t[0] += ka
                    t[1] += ks
                    t[2] += len(common)
                    t[3] += pos
                    t[4] += neg
    pm += ["", "Pooled over families and budgets (per variant and mode):", "",
           "| KV heads | mode | random | random-shared | difference | random right only | shared right only | sign p |",
           "|---|---|---|---|---|---|---|---|"]
    for (v, mode), (ka, ks, n, pos, neg) in pooled.items():
        la, ha = wilson(ka, n)
        ls, hs = wilson(ks, n)
        pm.append(f"| {v[2:]} | {mode} | {ka}/{n} = {ka / n:.3f} [{la:.2f}, {ha:.2f}] | {ks}/{n} = {ks / n:.3f} "
                  f"[{ls:.2f}, {hs:.2f}] | {(ka - ks) / n:+.3f} | {pos} | {neg} | {sign_p(pos, neg):.3g} |")
    # once: was the fact's slot still held by some (layer, KV head) at the end?
    pm += ["", "`once`, the code stated once: rollouts whose code slot some (layer, KV head) still held at the end"
           " (kept: right/rollouts; lost: right/rollouts):", "",
           "| KV heads | mode | policy | B | kept | lost |", "|---|---|---|---|---|---|"]
    for v, _ in VARIANTS:
        for suffix, mode in MODES:
            for c in cells:
                if (c["variant"], c["family"], c["mode"]) == (v, "once", mode) and c["policy"] in ("random", "random-shared") \
                        and c["budget"] is not None and c["kept"] != "":
                    pm.append(f"| {v[2:]} | {mode} | {c['policy']} | {c['budget']} | {c['kept_right']}/{c['kept']} | "
                              f"{c['lost_right']}/{c['lost']} |")
    with open(os.path.join(outdir, "paired.md"), "w") as f:
        f.write("\n".join(pm) + "\n")

    # Seed check: FAMILY-unpinned-seedS folders (eval seeds 2, 3) next to seed 1's FAMILY-unpinned.
    sm = ["| KV heads | family | B | eval seed | random | random-shared | random right only | shared right only | sign p |",
          "|---|---|---|---|---|---|---|---|---|"]
    for v, _ in VARIANTS:
        for fam in FAMILIES:
            seeds = [(1, os.path.join(grid, v, fam + "-unpinned"))]
            seeds += [(s_, os.path.join(grid, v, f"{fam}-unpinned-seed{s_}")) for s_ in (2, 3)]
            seeds = [(s_, d) for s_, d in seeds if os.path.isdir(d)]
            if len(seeds) < 2:
                continue
            ros = [(s_, rollouts(d)) for s_, d in seeds]
            budgets = sorted({b for (p, b) in ros[-1][1] if p == "random" and b is not None})
            for b in budgets:
                tot = [0, 0, 0, 0, 0]
                for s_, ro in ros:
                    a, sh = ro[("random", b)], ro[("random-shared", b)]
                    common = sorted(set(a) & set(sh))
                    pos = sum(1 for i in common if a[i] and not sh[i])
                    neg = sum(1 for i in common if sh[i] and not a[i])
                    ka, ks = sum(a[i] for i in common), sum(sh[i] for i in common)
                    sm.append(f"| {v[2:]} | {fam} | {b} | {s_} | {ka}/{len(common)} | {ks}/{len(common)} | {pos} | {neg} | "
                              f"{sign_p(pos, neg):.3g} |")
                    for i, x in enumerate((ka, ks, len(common), pos, neg)):
                        tot[i] += x
                ka, ks, n, pos, neg = tot
                sm.append(f"| {v[2:]} | {fam} | {b} | **all {len(ros)}** | **{ka}/{n} = {ka / n:.2f}** | **{ks}/{n} = {ks / n:.2f}** | "
                          f"{pos} | {neg} | **{sign_p(pos, neg):.3g}** |")
    with open(os.path.join(outdir, "seeds.md"), "w") as f:
        f.write("\n".join(sm) + "\n")

    # Plot 1: random (solid) vs random-shared (dashed), colour = KV heads; rows = pinned / not pinned.
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), squeeze=False)
    for i, (suffix, mode) in enumerate(MODES):
        for j, fam in enumerate(FAMILIES):
            ax = axes[i][j]
            for v, vname in VARIANTS:
                for p, ls in (("random", "-"), ("random-shared", "--")):
                    pts = sorted((c["budget"], c) for c in cells if (c["variant"], c["family"], c["mode"], c["policy"])
                                 == (v, fam, mode, p) and c["budget"] is not None)
                    if not pts:
                        continue
                    xs = [b for b, _ in pts]
                    ys = [c["acc"] for _, c in pts]
                    err = [[max(0.0, c["acc"] - c["lo"]) for _, c in pts], [max(0.0, c["hi"] - c["acc"]) for _, c in pts]]
                    off = {"kv1": -0.012, "kv2": 0.0, "kv4": 0.012}[v] * (max(xs) - min(xs) + 1)
                    off += (0.004 if p == "random-shared" else -0.004) * (max(xs) - min(xs) + 1)
                    ax.errorbar([x + off for x in xs], ys, yerr=err, color=COLORS[v], ls=ls, marker="o", ms=4, capsize=2,
                                label=f"{p}, {vname}")
            ax.set_title(f"{fam}, {mode}")
            ax.set_xlabel("budget B (slots per layer and KV head)")
            ax.set_ylabel("accuracy")
            ax.set_ylim(-0.03, 1.03)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.suptitle("Q3: per-head (random, solid) vs shared (random-shared, dashed) keep-sets; 95% Wilson intervals")
    fig.tight_layout(rect=(0, 0, 0.83, 1))
    fig.savefig(os.path.join(outdir, "independence.png"), dpi=90)

    # Plot 2: every pinned policy, one panel per (variant, family).
    fig, axes = plt.subplots(3, 3, figsize=(15, 11), squeeze=False)
    mode = MODES[0][1]
    for i, (v, vname) in enumerate(VARIANTS):
        for j, fam in enumerate(FAMILIES):
            ax = axes[i][j]
            pols = []
            for c in cells:
                if (c["variant"], c["family"], c["mode"]) == (v, fam, mode) and c["budget"] is not None and c["policy"] not in pols:
                    pols.append(c["policy"])
            for p in pols:
                pts = sorted((c["budget"], c["acc"]) for c in cells
                             if (c["variant"], c["family"], c["mode"], c["policy"]) == (v, fam, mode, p) and c["budget"] is not None)
                ax.plot([b for b, _ in pts], [a for _, a in pts], marker="o", label=p,
                        ls="--" if p.startswith("random") else "-")
            ax.set_title(f"{vname}: {fam}")
            ax.set_xlabel("budget B")
            ax.set_ylabel("accuracy")
            ax.set_ylim(-0.03, 1.03)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=9, loc="center right")
    fig.suptitle("Q3: random vs random-shared vs scored selectors (prompt pinned), per KV-head count")
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(os.path.join(outdir, "scored.png"), dpi=80)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
