#!/usr/bin/python3
"""StreamingLLM's question on every model of the real-models report, from its committed data.

Usage: report-sinks-models.py DATA_DIR OUT_MD   (called by report-sinks.sh; DATA_DIR is
docs/reports/data/real-models, written by report-real-models.sh)

Per model (and, for the trace reasoner, per kind of task set): whether any head is a sink head
(mean attention mass on the first 4 positions, full cache, sink_mass.csv), and what 4 sinks add to
a window: teacher-forced KL from `full` (nats/token, per-text means) of `recency` (the newest B
slots) and `streaming` (the same window plus positions 0-3), paired over texts with
report-real-models.py's percentile bootstrap (same resamples), beside `recency+prompt` (the window
plus the first P tokens). A sink failure in StreamingLLM's sense is a window whose KL is far above
the same window with sinks; here Δ = KL(streaming) − KL(recency) < 0 means the sinks help.
"""
import importlib.util
import os
import sys

_spec = importlib.util.spec_from_file_location(
    "real_models", os.path.join(os.path.dirname(os.path.abspath(__file__)), "report-real-models.py"))
rm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rm)

SINK_HEAD = 0.3  # a head with at least this mass on positions 0-3 is counted as a sink head


def main(data, out_md):
    md = ["| model (texts) | max head mass on positions 0-3 (× uniform) | sink heads (≥ 0.3) | B (B/len) | "
          "recency KL | streaming KL | Δ streaming − recency [95% CI] | recency+prompt KL (P) |",
          "|---|---:|---:|---|---:|---:|---|---:|"]
    for name, folder, only, _title in rm.MODELS:
        if not os.path.isdir(os.path.join(data, folder)):
            continue
        rows, sinks, corpora = rm.load(data, folder, only)
        if not rows:
            continue
        cells = {}
        for r in rows:
            cells.setdefault((r["policy"], int(r["budget"])), {})[(r["corpus"], r["source"], r["text"])] = r
        if ("streaming", min(b for _, b in cells)) not in cells:
            continue
        heads = [h for c in corpora for h in sinks[c]]
        top = max(heads, key=lambda h: float(h["mass_first_4"]))
        n_sink = len({(h["layer"], h["head"]) for h in heads if float(h["mass_first_4"]) >= SINK_HEAD})
        n_heads = len({(h["layer"], h["head"]) for h in heads})
        length = max(int(r["tokens"]) for r in rows)
        prompt = sorted({int(r["prompt"]) for r in rows})
        n_texts = len({k for c in cells.values() for k in c})
        first = True
        for b in sorted({b for p, b in cells if p == "streaming"}):
            mean = {p: sum(float(r["kl"]) for r in cells[(p, b)].values()) / len(cells[(p, b)])
                    for p in ("recency", "streaming", "recency+prompt")}
            d, lo, hi, n = rm.paired(cells, "streaming", "recency", b)
            lead = (f"| {name} ({n_texts}) | {float(top['mass_first_4']):.3f} "
                    f"({float(top['mass_first_4']) / float(top['uniform']):.1f}×) | {n_sink} of {n_heads} |"
                    if first else "| | | |")
            first = False
            md.append(f"{lead} {b} ({100 * b / length:.0f}%) | {mean['recency']:.4f} | {mean['streaming']:.4f} | "
                      f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}] | {mean['recency+prompt']:.4f} "
                      f"({prompt[0]}{'' if len(prompt) == 1 else f'–{prompt[-1]}'}) |")
    md.append("")
    md.append("Mass: the largest mean attention mass any query head puts on positions 0-3 under the full cache, "
              "over the model's corpora, and that over what uniform attention would give. KL: per-text mean "
              "nats/token over the scored tokens, averaged over texts; Δ paired over the same texts with a 95% "
              f"percentile bootstrap ({rm.BOOT} resamples, seed 1; scripts/report-real-models.py). "
              "Source: docs/reports/data/real-models/ (scripts/report-real-models.sh).")
    with open(out_md, "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
