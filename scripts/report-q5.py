#!/usr/bin/python3
"""Tables and plot of the Q5 throughput report (docs/reports/q5-throughput.md), measured.

Usage:
    report-q5.py DATA_DIR PLOT_PNG  > tables.md
Reads DATA_DIR/*.json, written by `kvevict bench throughput --tables interleaved` (and
`--probs-kernel`, `--tables iso-memory`) from scripts/report-q5-throughput.sh, and the accuracy the
trace reasoner's reports measured at the same B and r = 32 (docs/reports/q2-redundancy/data/recall-m1,
docs/reports/q4-beacons/data/revisit-m4: kvevict's own summaries, N = 300 each). Every number in a
table is kvevict's: the gain of random over a policy X in one repetition is t(X) / t(random) - 1
(same repetition, so same machine state), its rounds part (rounds ms of X - of random) / t(random),
the rest the difference; the medians and sign-test intervals are the bench's (median_ci). Nothing
is modelled here.
"""

import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DATA, PLOT = sys.argv[1], sys.argv[2]
T_BUDGETS = [128, 192, 256, 384, 512, 768]
ACC_SOURCES = [("recall-m1", "docs/reports/q2-redundancy/data/recall-m1/summary-vs-full.csv", "Q2"),
               ("revisit-m4", "docs/reports/q4-beacons/data/revisit-m4/summary-vs-full.csv", "Q4")]


def load(name):
    with open(os.path.join(DATA, name + ".json")) as f:
        return json.load(f)


def accuracy():
    """{set: {(policy, budget or None): accuracy}} from the committed summaries."""
    out = {}
    for name, path, _ in ACC_SOURCES:
        acc = {}
        with open(path) as f:
            for row in csv.DictReader(f):
                b = int(row["budget"]) if row["budget"] else None
                acc[(row["policy"], b)] = float(row["accuracy"])
        out[name] = acc
    return out


ACC = accuracy()


def acc_cell(policy, b):
    cells = []
    for name, _, _ in ACC_SOURCES:
        a = ACC[name].get((policy, None if policy == "full" else b))
        cells.append(f"{a:.2f}" if a is not None else "–")
    return cells


def pct(ci, digits=0):
    f = f"{{:+.{digits}f}}"
    if not ci["valid"]:
        return f.format(100 * ci["median"]) + "% (no interval)"
    return f"{f.format(100 * ci['median'])}% [{f.format(100 * ci['lo'])}, {f.format(100 * ci['hi'])}]"


def setting(j):
    i = j["interleaved"] if "interleaved" in j else {}
    cover = next((r["gain"]["coverage"] for r in i.get("rows", []) if r["gain"]["valid"]), None)
    return (f"B = {j['budget']}, r = {j['recent']}, batch {i.get('batch', '?')}, from {j['start_length']} generated "
            f"tokens, {j['reps']} repetitions x {i.get('steps', '?')} steps, {j['threads']} thread(s); "
            f"load {j['load_before']} before, {j['load_after']} after ({j['load_wait']})" +
            (f"; intervals cover {100 * cover:.1f}%" if cover else ""))


def detail(name, title, with_acc):
    j = load(name)
    rows = j["interleaved"]["rows"]
    print(f"### {title}\n")
    print(setting(j) + ".\n")
    head = "| policy | tok/s | step ms (min–max) | rounds ms/step | random's gain | of which rounds | rest |"
    sep = "|---|---:|---:|---:|---:|---:|---:|"
    if with_acc:
        head += " accuracy recall-m1 (Q2) | revisit-m4 (Q4) |"
        sep += "---:|---:|"
    print(head + "\n" + sep)
    for r in rows:
        s = r["step_ms"]
        line = (f"| {r['policy']} | {r['tok_per_s']:.0f} | {s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f}) | "
                f"{r['round_ms_per_step']['median']:.2f} | ")
        if r["policy"] == "random":
            line += "(baseline) | | |"
        else:
            line += f"{pct(r['gain'])} | {pct(r['round_gain'])} | {pct(r['other_gain'])} |"
        if with_acc:
            line += " " + " | ".join(acc_cell(r["policy"], j["budget"])) + " |"
        print(line)
    print()


def sweep(title, names, label, key):
    js = [load(n) for n in names]
    policies = [r["policy"] for r in js[0]["interleaved"]["rows"] if r["policy"] != "random"]
    print(f"### {title}\n")
    print("Random's gain over each policy, median [95% interval] over repetitions; per column: " +
          "; ".join(f"{label} {key(j)}: load {j['load_before'].split()[0]} before" for j in js) + ".\n")
    print("| policy | " + " | ".join(f"{label} = {key(j)}" for j in js) + " |")
    print("|---|" + "---:|" * len(js))
    for p in policies:
        cells = []
        for j in js:
            r = next((r for r in j["interleaved"]["rows"] if r["policy"] == p), None)
            cells.append(pct(r["gain"]) if r else "–")
        print(f"| {p} | " + " | ".join(cells) + " |")
    print()


def rest_resolved(names):
    """The sweep cells whose rest (gain minus the rounds part) has an interval excluding 0."""
    hits, cells, seen, miss = [], 0, set(), 0.0
    for n in names:
        if n in seen:
            continue
        seen.add(n)
        j = load(n)
        for r in j["interleaved"]["rows"]:
            if r["policy"] in ("random", "full"):
                continue
            c = r["other_gain"]
            cells += 1
            miss += 1 - c["coverage"]
            if c["valid"] and (c["lo"] > 0 or c["hi"] < 0):
                hits.append(f"{n} {r['policy']} {pct(c, 1)}")
    print(f"The rest (gain minus its rounds part) excludes 0 in {len(hits)} of the {cells} (setting, evicting policy) "
          f"cells of these sweeps (about {miss:.1f} expected by chance at each interval's coverage)" +
          (": " + "; ".join(hits) + "." if hits else ".") + "\n")


def accuracy_table():
    print("### Accuracy at the same B and r = 32 (trace reasoner; committed data of Q2 and Q4, N = 300 each)\n")
    print("recall-m1: a value computed once in the trace, needed ~1,100 tokens later (Q2); revisit-m4: the same,"
          " re-read at 3 far checkpoints (Q4). Budget as a fraction of the ~1,260-token sequence in brackets.\n")
    print("| policy | " + " | ".join(f"B = {b} ({b / 1258:.0%})" for b in T_BUDGETS) + " |")
    print("|---|" + "---:|" * len(T_BUDGETS))
    j = load("t-b384")
    for r in j["interleaved"]["rows"]:
        p = r["policy"]
        if p == "full":
            continue
        cells = [" / ".join(acc_cell(p, b)) for b in T_BUDGETS]
        if all(c == "– / –" for c in cells):
            continue
        print(f"| {p} | " + " | ".join(cells) + " |")
    print(f"| full (no eviction) | {' / '.join(acc_cell('full', None))} (every B) |" + " |" * (len(T_BUDGETS) - 1))
    print("\nEach cell: recall-m1 / revisit-m4 (– = not run there).\n")


def plot():
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    js = {b: load(f"t-b{b}") for b in T_BUDGETS}
    every = [r["policy"] for r in js[128]["interleaved"]["rows"]]
    color = {p: f"C{i}" if i < 10 else "black" for i, p in enumerate(every)}  # one per policy, both panels
    policies = [p for p in every if p != "random"]
    acc = [ACC["recall-m1"].get(("random", b)) for b in T_BUDGETS]
    a2.plot(T_BUDGETS, acc, marker="o", ms=3, color=color["random"], label="random")
    for p in policies:
        med, lo, hi = [], [], []
        for b in T_BUDGETS:
            r = next(r for r in js[b]["interleaved"]["rows"] if r["policy"] == p)
            med.append(100 * r["gain"]["median"])
            lo.append(100 * (r["gain"]["median"] - r["gain"]["lo"]))
            hi.append(100 * (r["gain"]["hi"] - r["gain"]["median"]))
        a1.errorbar(T_BUDGETS, med, yerr=[lo, hi], marker="o", ms=3, capsize=2, label=p, color=color[p])
        acc = [ACC["recall-m1"].get((p, b)) for b in T_BUDGETS]
        if any(a is not None for a in acc):
            a2.plot([b for b, a in zip(T_BUDGETS, acc) if a is not None], [a for a in acc if a is not None],
                    marker="o", ms=3, label=p, color=color[p])
    a1.axhline(0, color="grey", lw=0.8)
    a1.set_yscale("symlog", linthresh=10)
    a1.set_xlabel("budget B (tokens per KV head)")
    a1.set_ylabel("random's throughput gain, % (median, 95% interval)")
    a1.set_title("trace reasoner, r = 32, batch 16, from 1,024 tokens", fontsize=9)
    a2.set_xlabel("budget B")
    a2.set_ylabel("accuracy, recall-m1 (Q2, N = 300)")
    a2.set_ylim(-0.02, 1.02)
    a2.set_title("accuracy at the same B and r", fontsize=9)
    a1.legend(fontsize=7, ncol=2)
    a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def probs_and_memory():
    j = load("s-b1024")
    print("### Probability kernel (SmolLM2-135M shape, B = 1024, batch 4)\n")
    print("`random` with and without the attention kernel forced to compute probabilities (same selection), "
          "timed in alternating blocks of 8 steps; " + f"load {j['load_before']} before.\n")
    print("| policy | plain step ms (min–max) | forced step ms (min–max) | forced − plain, ms per step: median of "
          "block pairs [95% interval] (min–max) | % of plain [interval] |\n|---|---:|---:|---:|---:|")
    for r in j["probs_kernel"]:
        p, f, d, c = r["plain"]["step_ms"], r["forced"]["step_ms"], r["diff_ms_per_step"], r["diff_ci"]
        print(f"| {r['policy']} | {p['median']:.2f} ({p['min']:.2f}–{p['max']:.2f}) | {f['median']:.2f} "
              f"({f['min']:.2f}–{f['max']:.2f}) | {c['median']:+.2f} [{c['lo']:+.2f}, {c['hi']:+.2f}] "
              f"({d['min']:+.2f}–{d['max']:+.2f}), {r['blocks']} pairs | "
              f"{100 * c['median'] / p['median']:+.1f}% [{100 * c['lo'] / p['median']:+.1f}, "
              f"{100 * c['hi'] / p['median']:+.1f}] |")
    m = load("s-memory")
    print("\n### Equal KV memory (SmolLM2-135M shape, 256 MiB pool, B = 1024, r = 64, from 4,096 tokens)\n")
    print(f"Load {m['load_before']} before. Batch admitted = pool / (slots x bytes per slot), checked against the "
          "bytes each cache allocated.\n")
    print("| policy | slots per sequence | sequences admitted | allocated = predicted | tok/s at that batch |\n"
          "|---|---:|---:|---|---:|")
    for r in m["iso_memory"]:
        same = "yes" if r["allocated_bytes_per_seq"] == r["predicted_bytes_per_seq"] else "NO"
        print(f"| {r['policy']} | {r['slots_per_seq']} | {r['max_batch']}{' (run: %d)' % r['run_batch'] if r['capped'] else ''} "
              f"| {same} | {r['tok_per_s']:.1f} |")
    print()


print("## Trace reasoner: the model whose accuracy was measured\n")
detail("t-b384", "At B = 384 (31% of the ~1,260-token recall sequence), r = 32, batch 16", True)
accuracy_table()
sweep("Budget sweep (r = 32, batch 16, from 1,024 tokens)", [f"t-b{b}" for b in T_BUDGETS], "B",
      lambda j: j["budget"])
print("![gain and accuracy vs budget](q5-throughput/gain-vs-budget.png)\n")
sweep("Recent-buffer sweep (B = 384, batch 16, from 1,024 tokens)", ["t-r16", "t-b384", "t-r64"], "r",
      lambda j: j["recent"])
sweep("Batch sweep (B = 384, r = 32, from 1,024 tokens)", ["t-batch1", "t-batch4", "t-b384", "t-batch64"], "batch",
      lambda j: j["interleaved"]["batch"])
sweep("Context sweep (B = 384, r = 32, batch 16)", ["t-ctx512", "t-b384", "t-ctx2048"], "from",
      lambda j: j["start_length"])
rest_resolved([f"t-b{b}" for b in T_BUDGETS] + ["t-r16", "t-r64", "t-batch1", "t-batch4", "t-batch64", "t-ctx512",
                                                 "t-ctx2048"])
print("## SmolLM2-135M shape, synthetic weights: a real model's proportions, no accuracy\n")
detail("s-b1024", "At B = 1024, r = 64, batch 4, from 4,096 tokens", False)
sweep("Budget sweep (r = 64, batch 4, from 4,096 tokens)", ["s-b512", "s-b1024", "s-b2048"], "B",
      lambda j: j["budget"])
rest_resolved(["s-b512", "s-b1024", "s-b2048"])
probs_and_memory()
plot()
