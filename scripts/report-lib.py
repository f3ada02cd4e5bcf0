#!/usr/bin/python3
"""Tables and plots for the docs/reports/ scripts; the statistics are kvevict's own.

Usage:
    report-lib.py table OUT.md PNG TITLE LABEL=DIR [LABEL=DIR ...]
        Accuracy per policy (rows) and budget (columns) with its 95% interval, the budget also as
        a fraction of the mean sequence length; for `once` runs, accuracy split by whether the
        fact's slot was kept. DIR is a report data folder (summary-vs-full.csv) or a `kvevict
        eval` output folder (summary.csv). Plots accuracy vs budget, one panel per LABEL. Env
        REPORT_POLICIES (comma-separated) keeps only those policies.
    report-lib.py compare OUT.md [--vs REF=P1,...[@LABEL,...]]... [--diff REF=P1,...[@LABEL,...]]...
                          [--across POLICY:LABEL_A:LABEL_B]... [--between POLICY:LABEL:B1:B2]... LABEL=DIR...
        Paired comparisons, read from DIR/summary-vs-REF.csv and DIR/pooled-vs-REF.csv (per
        budget, and pooled over budgets with each problem counted once): Δ with its bootstrap CI,
        the exact sign test, and (--vs, where equivalence is the claim; not --diff) the TOST
        equivalence test with its power, as kvevict merge computed them (src/eval/summary.cpp,
        src/eval/stats.h: Tango's score TOST on one greedy rollout per problem, the paired t TOST
        on per-problem means). Holm's step-down adjustment is applied across every comparison of
        the call: one family for the sign tests, one for the TOSTs; "≈" is claimed only where the
        Holm-adjusted TOST p < 0.05. @LABEL,... limits a --vs / --diff to those task sets. --across compares one policy between two task
        sets on the same problem indices (DIR/rollouts.csv), at each budget both ran, with the
        same exact sign test (scipy.stats.binomtest on the discordant pairs, which kvevict's
        sign_test_p equals: min(1, 2 P(X <= min)), X ~ Binomial(n+ + n-, 1/2)); its p-values join the
        sign-test family. --between compares one policy on one task set between two budgets, B1 − B2,
        problem by problem, with the same test (is a larger budget ever worse?).
    report-lib.py combine OUT REF CELLDIR...
        One `kvevict eval` folder from per-cell folders of one task set: their rollouts (text
        dropped) and a config naming every cell and REF as the reference, for `kvevict merge
        OUT -o DIR` to summarize (eval fixes the reference in its config; merge re-summarizes
        with the config it finds, so nothing is recomputed); and OUT/stops.csv, how each cell's
        rollouts ended (read from the text before it is dropped: graded right, first \\boxed{}
        right, two or more \\boxed{}, stopped at the length cap).
    report-lib.py save MERGED DATA REF [COMBINED]
        The compact data a report is made from, into DATA: summary-vs-REF.csv (kvevict's
        summary.csv), pooled-vs-REF.csv (summary.json's pooled comparisons), and, for REF = full,
        config.json and rollouts.csv (policy,budget,correct: one character per problem index,
        1 right, 0 wrong, - not run), cost.csv (engine seconds per cell) and COMBINED's
        stops.csv. Checks that Holm here reproduces kvevict's sign_p_holm.
    report-lib.py cost DATA...
        One line: the engine time of every cell in the data folders (cost.csv).
/usr/bin/python3 with matplotlib and scipy (scripts/setup.sh installs them).
"""

import collections
import csv
import json
import os
import re
import shutil
import sys

ALPHA = 0.05


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def summary_path(dir_, ref="full"):
    """A report data folder's summary against REF, or an eval folder's summary.csv."""
    p = os.path.join(dir_, f"summary-vs-{ref}.csv")
    return p if os.path.exists(p) else os.path.join(dir_, "summary.csv")


def holm(ps):
    """Holm-adjusted p in input order: sorted ascending, p_(i) -> min(1, max_{j<=i} (m-j+1) p_(j)).
    The definition of kvevict's holm_adjust (src/eval/stats.h); `save` checks they agree."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, run = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = run
    return out


def fmt_budget(b, fracs):
    f = sorted(fracs)
    return f"B = {b} ({100 * f[len(f) // 2]:.0f}%)" if f else f"B = {b}"


# ---------------------------------------------------------------------------------------------
# table


def table(out_md, png, title, runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    md = []
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.2), squeeze=False)
    only = [p for p in os.environ.get("REPORT_POLICIES", "").split(",") if p]
    for (label, dir_), ax in zip(runs, axes[0]):
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # up to 20 distinct policies
        rows = read_csv(summary_path(dir_))
        budgets = sorted({int(r["budget"]) for r in rows if r["budget"]})
        full = [r for r in rows if not r["budget"]]
        policies = []
        for r in rows:
            if r["budget"] and r["policy"] not in policies and (not only or r["policy"] in only):
                policies.append(r["policy"])
        cell = {(r["policy"], int(r["budget"])): r for r in rows if r["budget"]}
        # B/L per cell is the cell's own (its generated length); the header gives the median.
        fracs = {b: [float(r["budget_fraction"]) for (p, bb), r in cell.items() if bb == b and float(r["budget_fraction"]) > 0]
                 for b in budgets}
        method = rows[0].get("accuracy_ci_method") or "bootstrap"  # read, never assumed
        mean_len = float(full[0]["mean_length"]) if full else None
        md.append(f"**{label}** (`{dir_}`; {rows[0]['expected_rollouts']} problems per cell"
                  + (f"; full = {float(full[0]['accuracy']):.2f}" if full else "")
                  + (f"; mean sequence {mean_len:.0f} tokens" if mean_len else "")
                  + f"; accuracy [95% {method} interval]; B (B / mean sequence length))\n")
        md.append("| policy | " + " | ".join(fmt_budget(b, fracs[b]) for b in budgets) + " |")
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
        ax.set_xlabel("budget B (B / mean sequence length)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xticks(budgets)
        ax.set_xticklabels([f"{b}\n({100 * sorted(fracs[b])[len(fracs[b]) // 2]:.0f}%)" if fracs[b] else str(b)
                            for b in budgets], fontsize=7)
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
        stops_path = os.path.join(dir_, "stops.csv")
        stops = {(r["policy"], int(r["budget"] or 0)): r for r in read_csv(stops_path)} if os.path.exists(stops_path) else {}
        late = [k for k, r in stops.items() if int(r["answered_twice_or_more"]) or int(r["at_length_cap"])]
        if late:
            md.append(f"How rollouts ended ({label}), where some answered more than once or ran to the length cap: "
                      "graded right / first answer right / answered twice or more / at the length cap, of the cell's "
                      "rollouts (the grader reads the last `\\boxed{}`)\n")
            lb = sorted({b for _, b in late})
            md.append("| policy | " + " | ".join(f"B = {b}" if b else "full" for b in lb) + " |")
            md.append("|---|" + "---|" * len(lb))
            for p in ["full"] + policies:
                if not any(k[0] == p for k in late):
                    continue
                cells = []
                for b in lb:
                    r = stops.get((p, b))
                    cells.append(f"{r['graded_right']} / {r['first_answer_right']} / {r['answered_twice_or_more']} / "
                                 f"{r['at_length_cap']} of {r['rollouts']}" if r else "–")
                md.append(f"| {p} | " + " | ".join(cells) + " |")
            md.append("")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="center right")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(png, dpi=100)
    with open(out_md, "w") as f:
        f.write("\n".join(md) + "\n")


# ---------------------------------------------------------------------------------------------
# compare


def read_correct(dir_):
    """(policy, budget) -> per-problem-index '1' / '0' / '-' string, from DIR/rollouts.csv."""
    return {(r["policy"], int(r["budget"] or 0)): r["correct"] for r in read_csv(os.path.join(dir_, "rollouts.csv"))}


def sign_p(n_pos, n_neg):
    from scipy.stats import binomtest

    return 1.0 if n_pos + n_neg == 0 else binomtest(n_pos, n_pos + n_neg, 0.5).pvalue


def paired_row(label, policy, ref, budget, sa, sb):
    """A sign-test row for two per-problem correctness strings on the same problem indices
    (problems not run on either side, '-', are left out): Δ = accuracy(a) − accuracy(b)."""
    pairs = [(x, y) for x, y in zip(sa, sb) if x != "-" and y != "-"]
    pos = sum(x == "1" and y == "0" for x, y in pairs)
    neg = sum(x == "0" and y == "1" for x, y in pairs)
    n = len(pairs)
    acc_a, acc_b = (sum(x[k] == "1" for x in pairs) / max(1, n) for k in (0, 1))
    return {"set": label, "policy": policy, "ref": ref, "budget": budget, "n": n,
            "acc": f"{acc_a:.2f} / {acc_b:.2f}", "diff": (pos - neg) / n if n else 0.0,
            "lo": None, "hi": None, "pos": pos, "neg": neg, "ties": n - pos - neg,
            "sign_p": sign_p(pos, neg), "kv_holm": None, "eq_p": None, "power": None,
            "margin": None, "method": ""}


def compare(out_md, vs, across, between, runs):
    """vs: (reference, policies, with the TOST?, only these labels (all if empty))."""
    rows = []  # one dict per comparison
    for ref, policies, tost, only in vs:
        for label, dir_ in runs:
            if only and label not in only:
                continue
            path = os.path.join(dir_, f"summary-vs-{ref}.csv")
            if not os.path.exists(path):
                sys.exit(f"{path}: missing (the report script saves a summary per reference it compares with)")
            cells = read_csv(path)
            pooled = {r["policy"]: r for r in read_csv(os.path.join(dir_, f"pooled-vs-{ref}.csv"))}
            for p in policies:
                mine = [c for c in cells if c["policy"] == p and c["reference"]]
                for c in sorted(mine, key=lambda c: int(c["budget"] or 0)):
                    rows.append({"set": label, "policy": p, "ref": c["reference"], "budget": f"{c['budget']} ({100 * float(c['budget_fraction']):.0f}%)",
                                 "n": int(c["problems"]), "acc": f"{float(c['accuracy']):.2f}",
                                 "diff": float(c["diff"]), "lo": float(c["diff_lo"]), "hi": float(c["diff_hi"]),
                                 "pos": int(c["sign_pos"]), "neg": int(c["sign_neg"]), "ties": int(c["sign_ties"]),
                                 "sign_p": float(c["sign_p"]), "kv_holm": float(c["sign_p_holm"]),
                                 "eq_p": float(c["equiv_p"]) if tost and c["equiv_p"] else None,
                                 "power": float(c["equiv_power"]) if c["equiv_power"] else None,
                                 "margin": float(c["equiv_margin"]) if c["equiv_margin"] else None,
                                 "method": c["equiv_method"]})
                if p in pooled:
                    r = pooled[p]
                    rows.append({"set": label, "policy": p, "ref": ref, "budget": f"pooled {r['budgets']}",
                                 "n": int(r["n"]), "acc": "", "diff": float(r["diff"]), "lo": float(r["diff_lo"]),
                                 "hi": float(r["diff_hi"]), "pos": int(r["sign_pos"]), "neg": int(r["sign_neg"]),
                                 "ties": int(r["sign_ties"]), "sign_p": float(r["sign_p"]), "kv_holm": None,
                                 "eq_p": float(r["equiv_p"]) if tost and r["equiv_p"] else None,
                                 "power": float(r["equiv_power"]) if r["equiv_power"] else None,
                                 "margin": float(r["equiv_margin"]) if r["equiv_margin"] else None,
                                 "method": r["equiv_method"]})
    dirs = dict(runs)
    for spec in across:
        policy, la, lb = spec.split(":")
        ca, cb = read_correct(dirs[la]), read_correct(dirs[lb])
        for (p, b) in sorted(k for k in ca if k[0] == policy and k in cb):
            # Over the paired problems only: two sets of different N pair their first min(N) problems
            # (problem i of every recall set shares its phase A), and both accuracies are over those.
            rows.append(paired_row(f"{la} − {lb}", p, f"{p} on {lb}", str(b), ca[(p, b)], cb[(p, b)]))
    for spec in between:
        policy, label, b1, b2 = spec.split(":")
        c = read_correct(dirs[label])
        if (policy, int(b1)) not in c or (policy, int(b2)) not in c:
            sys.exit(f"--between {spec}: {dirs[label]}/rollouts.csv has no {policy} at B = {b1} and {b2}")
        rows.append(paired_row(label, policy, f"{policy} at B = {b2}", f"{b1} − {b2}", c[(policy, int(b1))],
                               c[(policy, int(b2))]))
    # The cross-set rows' sign test must be kvevict's: checked on every row kvevict computed.
    for r in rows:
        if abs(sign_p(r["pos"], r["neg"]) - r["sign_p"]) > 1e-9 * max(1.0, r["sign_p"]):
            sys.exit(f"scipy's sign test {sign_p(r['pos'], r['neg'])} != kvevict's {r['sign_p']} ({r['set']}, {r['policy']})")
    sh = holm([r["sign_p"] for r in rows])
    eq = [i for i, r in enumerate(rows) if r["eq_p"] is not None]
    eh = holm([rows[i]["eq_p"] for i in eq])
    for r, p in zip(rows, sh):
        r["sign_holm"] = p
    for i, p in zip(eq, eh):
        rows[i]["eq_holm"] = p
    margins = sorted({r["margin"] for r in rows if r["margin"]})
    powers = sorted(r["power"] for r in rows if r["power"] is not None and r["eq_p"] is not None)
    ns = sorted({r["n"] for r in rows})
    methods = sorted({r["method"] for r in rows if r["method"] and r["eq_p"] is not None})
    if eq:
        md = [f"Paired comparisons ({len(rows)}; problems per comparison n = {', '.join(map(str, ns))}). "
              "Δ = accuracy(policy) − accuracy(reference) with its paired, problem-clustered 95% bootstrap CI; "
              "sign test exact, two-sided (+/−/= problems). Where equivalence is the claim, TOST within "
              f"±{', '.join(f'{100 * m:g}' for m in margins)} accuracy points at α = {ALPHA} "
              f"({' / '.join(methods)}: Tango 1998's score test on the discordant pairs of one greedy rollout per problem; "
              "the paired t test on per-problem means for the pooled rows); power = the probability that the TOST shows "
              "equivalence at this n when the true difference is 0 and the discordance (pooled: the spread) is as observed. "
              f"Holm's adjustment runs over all {len(rows)} sign tests of this table and, separately, all {len(eq)} TOSTs; "
              "≈ only where the Holm-adjusted TOST p < 0.05. Pooled rows: each problem's mean over the budgets, "
              "so a problem counts once. Computed by kvevict (src/eval/summary.cpp, src/eval/stats.h) except Holm "
              "across task sets and the cross-set rows (scripts/report-lib.py)."]
    else:  # only sign tests: no TOST and no equivalence claim in this table
        md = [f"Paired comparisons ({len(rows)}; problems per comparison n = {', '.join(map(str, ns))}). "
              "Δ = accuracy(a) − accuracy(b) on the same problems; sign test exact, two-sided (+/−/= problems: a right "
              f"and b wrong / the reverse / the same), scipy.stats.binomtest on the discordant pairs; Holm's adjustment "
              f"over all {len(rows)} sign tests of this table (scripts/report-lib.py)."]
    if between and eq:
        md[0] = md[0][:-len(").")] + ", with the cross-budget rows)."
    if powers:
        md[0] += f" TOST power here: median {powers[len(powers) // 2]:.2f}, range {powers[0]:.2f}–{powers[-1]:.2f}."
    md.append("")
    # The TOST columns only where this table has a TOST (a sign-test-only table claims no "≈").
    md.append("| task set | policy | vs | B (B/L) | n | acc. | Δ [95% CI] | sign p (+/−/=) | Holm p | "
              + ("TOST p | Holm TOST p | power | " if eq else "") + "|")
    md.append("|---|---|---|---|---:|---|---|---|---:|" + ("---:|---:|---:|" if eq else "") + "---|")
    for r in rows:
        ci = f" [{r['lo']:+.2f}, {r['hi']:+.2f}]" if r["lo"] is not None else ""
        eqp = f"{r['eq_p']:.3g}" if r["eq_p"] is not None else "–"
        eqh = f"{r['eq_holm']:.3g}" if "eq_holm" in r else "–"
        pw = f"{r['power']:.2f}" if r["power"] is not None else "–"
        pw = pw if r["eq_p"] is not None else "–"
        mark = "≈" if "eq_holm" in r and r["eq_holm"] < ALPHA else ("≠" if r["sign_holm"] < ALPHA else "")
        md.append(f"| {r['set']} | {r['policy']} | {r['ref']} | {r['budget']} | {r['n']} | {r['acc']} | {r['diff']:+.3f}{ci} | "
                  f"{r['sign_p']:.3g} ({r['pos']}/{r['neg']}/{r['ties']}) | {r['sign_holm']:.3g} | "
                  + (f"{eqp} | {eqh} | {pw} | " if eq else "") + f"{mark} |")
    md.append("")
    if eq:
        md.append("≈: equivalence shown (Holm-adjusted TOST p < 0.05); ≠: a difference shown (Holm-adjusted sign-test p < 0.05); "
                  "blank: neither — not evidence of equality.")
    else:
        md.append("≠: a difference shown (Holm-adjusted sign-test p < 0.05); blank: none shown — not evidence of equality "
                  "(this table tests no equivalence).")
    with open(out_md, "w") as f:
        f.write("\n".join(md) + "\n")


# ---------------------------------------------------------------------------------------------
# combine / save


def combine(out, ref, dirs):
    configs = [json.load(open(os.path.join(d, "config.json"))) for d in dirs]
    base = dict(configs[0])
    params = []
    for c in configs:
        for p in c["eviction"].get("params", []):
            if p not in params:
                params.append(p)
    # Cells differ by construction, the reference is chosen here, and the eviction params differ
    # only where a policy takes one (triattention's stats): anything else is another run.
    strip = lambda c: {k: v for k, v in c.items() if k not in ("cells", "reference", "eviction")}  # noqa: E731
    for d, c in zip(dirs, configs):
        if strip(c) != strip(base) or {k: v for k, v in c["eviction"].items() if k != "params"} != \
                {k: v for k, v in base["eviction"].items() if k != "params"}:
            sys.exit(f"{d}: settings differ from {dirs[0]}'s (another model, task file or sampler)")
    base["cells"] = [cell for c in configs for cell in c["cells"]]
    if ref not in {c["policy"] for c in base["cells"]}:
        sys.exit(f"reference '{ref}' is not among the cells")
    base["reference"] = ref
    base["eviction"] = dict(base["eviction"], params=params)
    os.makedirs(out, exist_ok=True)
    stops = collections.defaultdict(list)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(base, f, indent=2)
    with open(os.path.join(out, "rollouts.jsonl"), "w") as f:
        for d in dirs:
            path = os.path.join(d, "rollouts.jsonl")
            for line in open(path) if os.path.exists(path) else []:
                if line.endswith("\n"):  # a torn last line is a rollout still to run
                    r = json.loads(line)
                    stops[(r["policy"], r["budget"] or 0)].append(answers(r, path))
                    r["text"] = ""  # the summary does not read it
                    f.write(json.dumps(r) + "\n")
    # How each cell's rollouts ended, which the summary does not keep: a rollout that writes the
    # right answer and goes on to a second, wrong one is graded wrong (the grader reads the last
    # \boxed{}), a stopping failure rather than a lost value.
    with open(os.path.join(out, "stops.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "budget", "rollouts", "graded_right", "first_answer_right", "answered_twice_or_more",
                    "at_length_cap"])
        for (p, b), rs in stops.items():
            w.writerow([p, b or "", len(rs), sum(r[0] for r in rs), sum(r[1] for r in rs), sum(r[2] >= 2 for r in rs),
                        sum(r[3] for r in rs)])


BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def answers(r, path):
    """(graded right, first \\boxed{} right, number of \\boxed{}, stopped at the length cap) for one
    rollout. The answers of these task families hold no braces, so a flat match finds them; the
    last one must grade as kvevict's grader did (exact match after trimming, src/eval/grader.cpp)."""
    boxes = [b.strip() for b in BOXED.findall(r["text"])]
    gold = r["gold"].strip()
    if r.get("grade") == "graded" and (bool(boxes) and boxes[-1] == gold) != bool(r["correct"]):
        sys.exit(f"{path}: problem {r['problem_index']}: the last \\boxed{{}} here and kvevict's grade disagree")
    return (bool(r["correct"]), bool(boxes) and boxes[0] == gold, len(boxes), r.get("finish") == "length")


def save(merged, data, ref, combined=None):
    os.makedirs(data, exist_ok=True)
    if combined and ref == "full":  # combine's stopping counts (one file per task set)
        shutil.copy(os.path.join(combined, "stops.csv"), os.path.join(data, "stops.csv"))
    shutil.copy(os.path.join(merged, "summary.csv"), os.path.join(data, f"summary-vs-{ref}.csv"))
    cells = read_csv(os.path.join(merged, "summary.csv"))
    tested = [c for c in cells if c["sign_p"]]
    for c, h in zip(tested, holm([float(c["sign_p"]) for c in tested])):
        if abs(h - float(c["sign_p_holm"])) > 1e-9:
            sys.exit(f"{merged}: Holm here {h} != kvevict's {c['sign_p_holm']} for {c['policy']}@{c['budget']}")
    s = json.load(open(os.path.join(merged, "summary.json")))
    with open(os.path.join(data, f"pooled-vs-{ref}.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "reference", "budgets", "n", "diff", "diff_lo", "diff_hi", "sign_pos", "sign_neg",
                    "sign_ties", "sign_p", "equiv_method", "equiv_margin", "equiv_p", "equiv_power"])
        for p in s["pooled"]:
            d, st, e = p["diff"], p["sign_test"], p.get("equivalence") or {}
            w.writerow([p["policy"], ref, " ".join(map(str, p["budgets"])), d["n"], d["mean"], d["lo"], d["hi"],
                        st["pos"], st["neg"], st["ties"], st["p"], e.get("method", ""), e.get("margin", ""),
                        e.get("p", ""), e.get("power", "")])
    if ref != "full":
        return
    cfg = json.load(open(os.path.join(merged, "config.json")))
    with open(os.path.join(data, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    n = cfg["tasks"]["count"]
    correct, cost = {}, {}
    for line in open(os.path.join(merged, "rollouts.jsonl")):
        r = json.loads(line)
        key = (r["policy"], r["budget"] or 0)
        correct.setdefault(key, ["-"] * n)[r["problem_index"]] = "1" if r["correct"] else "0"
        c = cost.setdefault(key, [0, 0.0, 0])
        c[0] += 1
        c[1] += (r["prefill_ms"] + r["decode_ms"] + r["score_ms"] + r["compact_ms"]) / 1000
        c[2] += r["generated_tokens"]
    # What the cells cost (engine time, whichever report ran them), to size N and the budgets.
    with open(os.path.join(data, "cost.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "budget", "rollouts", "engine_s", "generated_tokens"])
        for c in cfg["cells"]:
            k = (c["policy"], c["budget"])
            if k in cost:
                w.writerow([c["policy"], c["budget"] or "", cost[k][0], f"{cost[k][1]:.3f}", cost[k][2]])
    with open(os.path.join(data, "rollouts.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "budget", "correct"])
        for c in cfg["cells"]:
            key = (c["policy"], c["budget"])
            w.writerow([c["policy"], c["budget"] or "", "".join(correct.get(key, ["-"] * n))])


def total_cost(dirs):
    """One line for a report's header: the engine time of every cell it tables."""
    secs, rollouts, problems = 0.0, 0, 0
    for d in dirs:
        rows = read_csv(os.path.join(d, "cost.csv"))
        secs += sum(float(r["engine_s"]) for r in rows)
        rollouts += sum(int(r["rollouts"]) for r in rows)
        problems += max((int(r["rollouts"]) for r in rows), default=0)
    print(f"engine time of its cells {secs / 3600:.2f} CPU-hours ({rollouts} generations, "
          f"{secs / max(1, rollouts):.3f} s each, {secs / max(1, problems):.1f} s per problem of a task set)")


def main(argv):
    if len(argv) >= 6 and argv[1] == "table":
        table(argv[2], argv[3], argv[4], [a.split("=", 1) for a in argv[5:]])
    elif len(argv) >= 3 and argv[1] == "compare":
        vs, across, between, runs, i = [], [], [], [], 3
        while i < len(argv):
            if argv[i] in ("--vs", "--diff"):
                ref, ps = argv[i + 1].split("=", 1)
                ps, _, only = ps.partition("@")
                vs.append((ref, [p for p in ps.split(",") if p], argv[i] == "--vs", [x for x in only.split(",") if x]))
                i += 2
            elif argv[i] in ("--across", "--between"):
                (across if argv[i] == "--across" else between).append(argv[i + 1])
                i += 2
            else:
                runs.append(tuple(argv[i].split("=", 1)))
                i += 1
        compare(argv[2], vs, across, between, runs)
    elif len(argv) >= 5 and argv[1] == "combine":
        combine(argv[2], argv[3], argv[4:])
    elif len(argv) >= 3 and argv[1] == "cost":
        total_cost(argv[2:])
    elif len(argv) in (5, 6) and argv[1] == "save":
        save(*argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
