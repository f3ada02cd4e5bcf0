#!/usr/bin/env python3
"""Writes docs/reports/real-models.md from the committed `kvevict divergence` outputs.

Usage: report-real-models.py DATA_DIR OUT_MD   (stdlib only; called by report-real-models.sh)

DATA_DIR/<model>/<corpus>/ holds divergence.csv (one row per text and (policy, budget) cell: kl and
nll are per-token means over the text's scored tokens), summary.json (kvevict's per-corpus
summary with its own percentile-bootstrap CIs) and sink_mass.csv (per query head: mean attention
mass on the first 4 positions under the full cache, and what uniform attention would give).
Pooled numbers here are means over texts with a percentile bootstrap over texts (seed 1, 4000
resamples); paired differences resample texts jointly, so both policies see the same texts.
"""
import csv
import math
import os
import random
import sys

MODELS = [("stories260k", "stories260K (GGUF, 260K parameters, trained on TinyStories)"),
          ("tinystories656k", "TinyStories-656K (Hugging Face safetensors, loaded directly)"),
          ("reasoner", "shipped reasoner (models/reasoner/reasoner.gguf) on its own task traces")]
# Policies that score what to keep (the "scored" side of the random-vs-scored question).
SCORED = ["snapkv", "snapkv+prompt", "rkv", "rkv+prompt", "vase", "vase+prompt", "h2o", "h2o+prompt",
          "tova", "tova+prompt", "triattention"]
BOOT = 4000


def boot_ci(values, rng):
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(BOOT))
    return means[int(0.025 * BOOT)], means[int(0.975 * BOOT) - 1]


def load(data, model):
    root = os.path.join(data, model)
    rows, sinks, corpora = [], {}, []
    for corpus in sorted(os.listdir(root)):
        d = os.path.join(root, corpus)
        if not os.path.isfile(os.path.join(d, "divergence.csv")):
            continue
        corpora.append(corpus)
        for r in csv.DictReader(open(os.path.join(d, "divergence.csv"))):
            r["corpus"] = corpus
            rows.append(r)
        sinks[corpus] = list(csv.DictReader(open(os.path.join(d, "sink_mass.csv"))))
    return rows, sinks, corpora


def fmt_ci(m, lo, hi, sign=False):
    f = "{:+.4f}" if sign else "{:.4f}"
    return (f + " [" + f + ", " + f + "]").format(m, lo, hi)


def model_section(data, model, title, out, headline):
    rows, sinks, corpora = load(data, model)
    if not rows:
        return None
    rng = random.Random(1)
    cells = {}
    for r in rows:
        key = (r["policy"], int(r["budget"]))
        cells.setdefault(key, {})[(r["corpus"], r["source"], r["text"])] = r
    policies = []
    for p, _ in cells:
        if p not in policies:
            policies.append(p)
    budgets = sorted({b for _, b in cells})
    tokens = sorted({int(r["tokens"]) for r in rows})
    n_texts = len({(r["corpus"], r["source"], r["text"]) for r in rows})
    prompt = sorted({int(r["prompt"]) for r in rows})
    length = max(tokens)
    full_ppl = {}
    for c in corpora:
        per_text = {(r["source"], r["text"]): float(r["full_nll"]) for r in rows if r["corpus"] == c}
        full_ppl[c] = math.exp(sum(per_text.values()) / len(per_text))
    per_source = {}
    for r in rows:
        per_source.setdefault(r["corpus"], set()).add((r["source"], r["text"]))
    out.append(f"## {title}\n")
    out.append(f"{n_texts} texts: " + ", ".join(f"{c} {len(per_source[c])} (full-cache perplexity "
                                                f"{full_ppl[c]:.2f})" for c in corpora) +
               f"; window {length} tokens (texts of {tokens[0]}–{tokens[-1]} tokens), prompt "
               f"{prompt[0]}–{prompt[-1]} tokens pinned by `+prompt` policies. "
               "B/len is B over the longest text (budgets were set as 10/20/40% of `--length`).\n")

    # Checks before reading: KL must fall with budget; KL >= 0; every cell has every text.
    checks = []
    for p in policies:
        kl = [sum(float(r["kl"]) for r in cells[(p, b)].values()) / len(cells[(p, b)]) for b in budgets]
        if not kl[-1] < kl[0]:
            checks.append(f"`{p}`: KL at the largest budget ({kl[-1]:.4f}) is not below KL at the smallest ({kl[0]:.4f})")
        for i in range(1, len(kl)):
            if kl[i] > kl[i - 1] * 1.05:
                checks.append(f"`{p}`: KL rises from B = {budgets[i-1]} ({kl[i-1]:.4f}) to B = {budgets[i]} ({kl[i]:.4f})")
        for b in budgets:
            if len(cells[(p, b)]) != n_texts:
                checks.append(f"`{p}` B = {b}: {len(cells[(p, b)])} texts, not {n_texts}")
            if min(float(r["kl"]) for r in cells[(p, b)].values()) < -1e-6:
                checks.append(f"`{p}` B = {b}: negative KL")
    out.append("Checks before reading: " + ("KL falls from 10% to 40% of the window for every policy; "
               "no negative KL; every cell has every text." if not checks else
               "; ".join(checks) + ". Every other policy's KL falls with budget; no negative KL.") + "\n")

    out.append("| policy | B | B/len | KL from full [95% CI] | perplexity | ΔNLL vs full [95% CI] | top-1 | n |")
    out.append("|---|---:|---:|---|---:|---|---:|---:|")
    means = {}
    for p in policies:
        for b in budgets:
            c = cells[(p, b)]
            kl = [float(r["kl"]) for r in c.values()]
            dn = [float(r["nll"]) - float(r["full_nll"]) for r in c.values()]
            nll = [float(r["nll"]) for r in c.values()]
            t1 = sum(float(r["top1"]) for r in c.values()) / len(c)
            m = sum(kl) / len(kl)
            means[(p, b)] = m
            lo, hi = boot_ci(kl, rng)
            dm = sum(dn) / len(dn)
            dlo, dhi = boot_ci(dn, rng)
            ppl = math.exp(sum(nll) / len(nll))
            out.append(f"| {p} | {b} | {b/length:.2f} | {fmt_ci(m, lo, hi)} | {ppl:.3f} | "
                       f"{fmt_ci(dm, dlo, dhi, True)} | {t1:.3f} | {len(c)} |")
    full_nll = {}
    for r in rows:
        full_nll[(r["corpus"], r["source"], r["text"])] = float(r["full_nll"])
    fp = math.exp(sum(full_nll.values()) / len(full_nll))
    out.append(f"\nFull cache: perplexity {fp:.3f} (exp of the mean per-text NLL over all {n_texts} texts; "
               "per-policy perplexity is computed the same way).\n")

    # Random vs the best scored policy per budget: paired difference of per-text KL.
    out.append("Random Attention against the scored policy with the lowest mean KL at each budget "
               "(paired over texts; Δ = KL(random) − KL(best); a CI above 0 means random moves the "
               "model further from full):\n")
    out.append("| B | B/len | random KL | best scored | its KL | Δ KL [95% CI] | random-unprotected KL | recency+prompt KL |")
    out.append("|---:|---:|---:|---|---:|---|---:|---:|")
    for b in budgets:
        present = [p for p in SCORED if (p, b) in means]
        best = min(present, key=lambda p: means[(p, b)])
        keys = sorted(cells[("random", b)])
        d = [float(cells[("random", b)][k]["kl"]) - float(cells[(best, b)][k]["kl"]) for k in keys]
        dm = sum(d) / len(d)
        lo, hi = boot_ci(d, rng)
        out.append(f"| {b} | {b/length:.2f} | {means[('random', b)]:.4f} | {best} | {means[(best, b)]:.4f} | "
                   f"{fmt_ci(dm, lo, hi, True)} | {means[('random-unprotected', b)]:.4f} | "
                   f"{means[('recency+prompt', b)]:.4f} |")
        headline.append((model, b, b / length, means[("random", b)], best, means[(best, b)], dm, lo, hi))
    out.append("")
    # Pinned vs unpinned pairs: does pinning the prompt change KL?
    out.append("Pinning the prompt (paired Δ KL = KL(policy+prompt) − KL(policy), 95% CI over texts):\n")
    out.append("| policy | " + " | ".join(f"B = {b} ({b/length:.2f})" for b in budgets) + " |")
    out.append("|---|" + "---|" * len(budgets))
    pairs = [("random-unprotected", "random")] + [(p, p + "+prompt") for p in
             ["recency", "snapkv", "rkv", "vase", "h2o", "tova"]]
    for a, pb in pairs:
        cols = []
        for b in budgets:
            keys = sorted(cells[(a, b)])
            d = [float(cells[(pb, b)][k]["kl"]) - float(cells[(a, b)][k]["kl"]) for k in keys]
            lo, hi = boot_ci(d, rng)
            cols.append(fmt_ci(sum(d) / len(d), lo, hi, True))
        out.append(f"| {pb} vs {a} | " + " | ".join(cols) + " |")
    out.append("")

    # Sinks.
    out.append("Attention mass on the first 4 positions (full cache, per query head, mean over query "
               "tokens at positions ≥ 16), against uniform attention over the same positions:\n")
    out.append("| corpus | heads | uniform | median head | max head (layer, head) | max / uniform | heads ≥ 0.3 |")
    out.append("|---|---:|---:|---:|---|---:|---:|")
    model_max = 0.0
    for c in corpora:
        s = sinks[c]
        m = sorted(float(r["mass_first_4"]) for r in s)
        top = max(s, key=lambda r: float(r["mass_first_4"]))
        u = float(s[0]["uniform"])
        model_max = max(model_max, m[-1])
        out.append(f"| {c} | {len(s)} | {u:.4f} | {m[len(m)//2]:.4f} | {m[-1]:.4f} ({top['layer']}, {top['head']}) | "
                   f"{m[-1]/u:.1f} | {sum(1 for x in m if x >= 0.3)} |")
    out.append("")
    return model_max


def main():
    data, out_md = sys.argv[1], sys.argv[2]
    out, headline, maxes = [], [], {}
    body = []
    for model, title in MODELS:
        if os.path.isdir(os.path.join(data, model)):
            m = model_section(data, model, title, body, headline)
            if m is not None:
                maxes[model] = m
    run = open(os.path.join(data, "run.txt")).read().strip() if os.path.exists(os.path.join(data, "run.txt")) else ""
    out.append("# Real models: KL divergence from the full cache, perplexity and attention sinks\n")
    out.append("Regenerated by `scripts/report-real-models.sh` (runs `kvevict divergence`, writes "
               "`docs/reports/data/real-models/`, then `scripts/report-real-models.py` writes this file "
               "from that committed data). A second line of evidence beside the synthetic reasoner: "
               "texts are teacher-forced through `full` and through every policy in lockstep, and each "
               "scored token contributes KL(p_full ‖ p_policy) in nats and its NLL. Budgets are 10, 20 "
               "and 40% of the window; the first P tokens play the prompt (pinned by `+prompt` policies "
               "and by `random`, `random-shared`, `random-beacon`, `triattention`); r is 8. TriAttention's "
               "statistics come from `kvevict calibrate` on PG-19 book 10762, which is not evaluated (reasoner: on held-out tasks, seed 7100). "
               "P is 8 for the text corpora; for the reasoner the prompt is each task's problem. "
               "`streaming+prompt` is not run: with a prompt of P ≥ 4 tokens its 4 sinks lie inside the pinned prompt, so it keeps what `recency+prompt` keeps. "
               "Intervals are 95% percentile bootstraps over texts (n texts per cell, given).\n")
    out.append("## Headline: Random Attention vs the best scored policy\n")
    out.append("| model | B | B/len | random KL | best scored | its KL | Δ KL [95% CI] |")
    out.append("|---|---:|---:|---:|---|---:|---|")
    for model, b, f, rk, best, bk, dm, lo, hi in headline:
        out.append(f"| {model} | {b} | {f:.2f} | {rk:.4f} | {best} | {bk:.4f} | {fmt_ci(dm, lo, hi, True)} |")
    out.append("")
    out.append("Largest per-head attention mass on the first 4 positions: " +
               ", ".join(f"{m} {v:.3f}" for m, v in maxes.items()) + ".\n")
    out.append("READING_PLACEHOLDER\n")
    out.extend(body)
    if run:
        out.append("## Run\n")
        out.append("```\n" + run + "\n```\n")
    text = "\n".join(out)
    reading_path = os.path.join(data, "reading.md")
    reading = open(reading_path).read().strip() if os.path.exists(reading_path) else \
        "(no reading yet: write docs/reports/data/real-models/reading.md)"
    text = text.replace("READING_PLACEHOLDER", "## Reading\n\n" + reading)
    open(out_md, "w").write(text)


if __name__ == "__main__":
    main()
