#!/usr/bin/env bash
# Side-by-side speed of kvevict and llama.cpp on the same synthetic GGUFs, alternating A/B.
#
#   scripts/bench-vs-llamacpp.sh [--llama DIR] [--quick] [--out DIR] [--threads N] [--rounds N]
#                                [--shapes LIST] [--types LIST] [--kvevict BIN]
#
# Measures, per (shape, type) and round:
#   single-stream decode  kvevict `bench decode` (64 steps)       llama-bench -n 64 (tg64)
#   prefill of 512        kvevict `bench decode --prefill 512`    llama-bench -p 512 (pp512)
#   aggregate decode at   kvevict `bench throughput --batch B      llama-batched-bench -npp 128
#   batch 1, 4, 16          --start-length 128 --policies full`      -ntg 32 -npl 1,4,16 (S_TG)
# The two engines alternate within every round (kvevict first in odd rounds, llama.cpp first in
# even ones); the 1-minute load average is recorded around every command and the copy bandwidth
# with every kvevict decode run. The table gives median (min-max) over the rounds and the
# kvevict / llama.cpp ratio of the medians, with the targets of the batched-kernel work.
#
# --llama DIR: a llama.cpp build's bin folder (with llama-bench and llama-batched-bench); built
#   outside this repository, e.g. cmake -DGGML_NATIVE=ON in /work/peers/llama.cpp. Without it
#   only kvevict is measured. A model llama.cpp cannot load (an architecture it does not know)
#   is reported as not measurable and the run goes on.
# --quick: SmolLM2-360M shape, q8_0 and q4_k_m, 2 rounds, shorter runs (a few minutes); the
#   full run (3 shapes x 3 types x 3 rounds) takes about an hour on 2 cores.
# Defaults: --out out/bench-vs-llamacpp, --threads = all cores, --rounds 3,
#   --shapes smollm2-360m,tinyllama-1.1b,qwen3-0.6b, --types q8_0,q4_0,q4_k_m,
#   --kvevict build/kvevict. Models are written to OUT/models (reused when present).
# Output: OUT/raw.jsonl (every sample with its load), OUT/table.md (printed too).
# Run it on a quiet machine: figures taken at load > 1 per core are marked in the table.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA="" QUICK=0 OUT="out/bench-vs-llamacpp" THREADS="$(nproc)" ROUNDS="" SHAPES="" TYPES="" KV="build/kvevict"
while [ $# -gt 0 ]; do
  case "$1" in
    --llama) LLAMA="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --shapes) SHAPES="$2"; shift 2 ;;
    --types) TYPES="$2"; shift 2 ;;
    --kvevict) KV="$2"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "bench-vs-llamacpp: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$KV" ] || { echo "bench-vs-llamacpp: kvevict binary '$KV' not found (build with scripts/build.sh or pass --kvevict)" >&2; exit 2; }
if [ -n "$LLAMA" ]; then
  for b in llama-bench llama-batched-bench; do
    [ -x "$LLAMA/$b" ] || { echo "bench-vs-llamacpp: '$LLAMA/$b' not found (--llama takes llama.cpp's bin folder)" >&2; exit 2; }
  done
fi
if [ "$QUICK" = 1 ]; then
  SHAPES="${SHAPES:-smollm2-360m}" TYPES="${TYPES:-q8_0,q4_k_m}" ROUNDS="${ROUNDS:-2}"
  DEC_STEPS=16 PREFILL=512 TP_STEPS=16 BATCHES="1,16" NTG=16
else
  SHAPES="${SHAPES:-smollm2-360m,tinyllama-1.1b,qwen3-0.6b}" TYPES="${TYPES:-q8_0,q4_0,q4_k_m}" ROUNDS="${ROUNDS:-3}"
  DEC_STEPS=64 PREFILL=512 TP_STEPS=64 BATCHES="1,4,16" NTG=32
fi
case "$ROUNDS" in ''|*[!0-9]*|0) echo "bench-vs-llamacpp: --rounds must be a positive integer" >&2; exit 2 ;; esac

mkdir -p "$OUT/models" "$OUT/logs"
RAW="$OUT/raw.jsonl"
: > "$RAW"
load1() { cut -d' ' -f1 /proc/loadavg; }

# record ENGINE SHAPE TYPE METRIC VALUE LOAD_BEFORE LOAD_AFTER ROUND [COPY_GBPS]
record() {
  printf '{"engine":"%s","shape":"%s","type":"%s","metric":"%s","value":%s,"load_before":%s,"load_after":%s,"round":%s,"copy_gbps":%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "${9:-null}" >> "$RAW"
}

kvevict_round() {  # MODEL SHAPE TYPE ROUND
  local m="$1" s="$2" t="$3" r="$4" lb la j
  j="$OUT/logs/kv-decode-$s-$t-$r.json"
  lb=$(load1)
  "$KV" bench decode -m "$m" -t "$THREADS" --no-sweep --steps "$DEC_STEPS" --prefill "$PREFILL" --reps 1 --json "$j" \
    > "$OUT/logs/kv-decode-$s-$t-$r.txt" 2>&1
  la=$(load1)
  python3 - "$j" "$s" "$t" "$r" "$lb" "$la" >> "$RAW" <<'PY'
import json, sys
j, s, t, r, lb, la = sys.argv[1:]
d = json.load(open(j))
bw = d["copy_bandwidth_gbps"]["median"]
def rec(metric, v):
    print(json.dumps({"engine": "kvevict", "shape": s, "type": t, "metric": metric, "value": v,
                      "load_before": float(lb), "load_after": float(la), "round": int(r), "copy_gbps": bw}))
rec("decode_tok_s", d["short_context"]["tok_per_s"])
for p in d.get("prefill", []):
    rec(f"prefill{p['prompt_tokens']}_tok_s", p["tok_per_s"])
PY
  local b
  for b in ${BATCHES//,/ }; do
    j="$OUT/logs/kv-tp$b-$s-$t-$r.json"
    lb=$(load1)
    "$KV" bench throughput -m "$m" -t "$THREADS" --batch "$b" --policies full --tables iso-batch --start-length 128 \
      --steps "$TP_STEPS" --reps 1 --json "$j" > "$OUT/logs/kv-tp$b-$s-$t-$r.txt" 2>&1
    la=$(load1)
    record kvevict "$s" "$t" "batch${b}_tok_s" \
      "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["iso_batch"][0]["tok_per_s"])' "$j")" "$lb" "$la" "$r"
  done
}

llama_round() {  # MODEL SHAPE TYPE ROUND
  local m="$1" s="$2" t="$3" r="$4" lb la log
  log="$OUT/logs/ll-bench-$s-$t-$r.jsonl"
  lb=$(load1)
  if ! "$LLAMA/llama-bench" -m "$m" -t "$THREADS" -p "$PREFILL" -n "$DEC_STEPS" -r 1 -o jsonl > "$log" 2> "$log.err"; then
    echo "  llama-bench could not run $s $t (see $log.err): not measurable" >&2
    record llama.cpp "$s" "$t" "not_measurable" 0 "$lb" "$(load1)" "$r"
    return
  fi
  la=$(load1)
  python3 - "$log" "$s" "$t" "$r" "$lb" "$la" >> "$RAW" <<'PY'
import json, sys
log, s, t, r, lb, la = sys.argv[1:]
for line in open(log):
    line = line.strip()
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    metric = f"prefill{d['n_prompt']}_tok_s" if d["n_prompt"] > 0 else "decode_tok_s"
    print(json.dumps({"engine": "llama.cpp", "shape": s, "type": t, "metric": metric, "value": d["avg_ts"],
                      "load_before": float(lb), "load_after": float(la), "round": int(r), "copy_gbps": None}))
PY
  log="$OUT/logs/ll-batched-$s-$t-$r.jsonl"
  local maxb=${BATCHES##*,}
  lb=$(load1)
  if ! "$LLAMA/llama-batched-bench" -m "$m" -t "$THREADS" -c $(( maxb * (128 + NTG) + 256 )) -b 2048 -ub 512 \
      -npp 128 -ntg "$NTG" -npl "$BATCHES" --output-format jsonl > "$log" 2> "$log.err"; then
    echo "  llama-batched-bench could not run $s $t (see $log.err): not measurable" >&2
    return
  fi
  la=$(load1)
  python3 - "$log" "$s" "$t" "$r" "$lb" "$la" >> "$RAW" <<'PY'
import json, sys
log, s, t, r, lb, la = sys.argv[1:]
for line in open(log):
    line = line.strip()
    if not line.startswith('{"n_kv_max"'):
        continue
    d = json.loads(line)
    print(json.dumps({"engine": "llama.cpp", "shape": s, "type": t, "metric": f"batch{d['pl']}_tok_s",
                      "value": d["speed_tg"], "load_before": float(lb), "load_after": float(la), "round": int(r),
                      "copy_gbps": None}))
PY
}

echo "# bench-vs-llamacpp: shapes $SHAPES, types $TYPES, $ROUNDS rounds, $THREADS threads, $(nproc) cores"
echo "# kvevict $(git rev-parse --short HEAD 2>/dev/null || echo '?')$( [ -n "$LLAMA" ] && echo ", llama.cpp at $LLAMA" )"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for s in ${SHAPES//,/ }; do
  for t in ${TYPES//,/ }; do
    m="$OUT/models/$s-$t.gguf"
    [ -f "$m" ] || "$KV" tools synth-gguf --shape "$s" --type "$t" --seed 0 -o "$m" > "$OUT/logs/synth-$s-$t.txt" 2>&1
  done
done
for r in $(seq 1 "$ROUNDS"); do
  for s in ${SHAPES//,/ }; do
    for t in ${TYPES//,/ }; do
      m="$OUT/models/$s-$t.gguf"
      echo "# round $r/$ROUNDS: $s $t (load $(load1))"
      if [ -z "$LLAMA" ]; then
        kvevict_round "$m" "$s" "$t" "$r"
      elif [ $((r % 2)) = 1 ]; then
        kvevict_round "$m" "$s" "$t" "$r"; llama_round "$m" "$s" "$t" "$r"
      else
        llama_round "$m" "$s" "$t" "$r"; kvevict_round "$m" "$s" "$t" "$r"
      fi
    done
  done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$RAW" "$(nproc)" "$PREFILL" "$BATCHES" > "$OUT/table.md" <<'PY'
import json, statistics, sys
raw, cores, prefill, batches = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
rows = [json.loads(l) for l in open(raw)]
keys = []
for r in rows:
    k = (r["shape"], r["type"])
    if k not in keys:
        keys.append(k)
def vals(engine, k, metric):
    return [r for r in rows if r["engine"] == engine and (r["shape"], r["type"]) == k and r["metric"] == metric]
def cell(rs):
    if not rs:
        return "–", None
    v = [r["value"] for r in rs]
    busy = max(max(r["load_before"], r["load_after"]) for r in rs) > cores
    s = f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})" + (" *" if busy else "")
    return s, statistics.median(v)
metrics = [("decode_tok_s", "decode tok/s (1 stream)"), (f"prefill{prefill}_tok_s", f"prefill {prefill} tok/s")]
metrics += [(f"batch{b}_tok_s", f"aggregate decode tok/s, batch {b}") for b in batches]
print("| shape | type | metric | kvevict | llama.cpp | kvevict / llama.cpp |")
print("|---|---|---|---|---|---|")
targets = []
for k in keys:
    nm = vals("llama.cpp", k, "not_measurable")
    for metric, label in metrics:
        a, am = cell(vals("kvevict", k, metric))
        b, bm = cell(vals("llama.cpp", k, metric))
        if nm and bm is None:
            b = "not measurable"
        ratio = f"{am / bm:.2f}" if am and bm else "–"
        print(f"| {k[0]} | {k[1]} | {label} | {a} | {b} | {ratio} |")
    a1 = cell(vals("kvevict", k, "batch1_tok_s"))[1]
    a16 = cell(vals("kvevict", k, f"batch{batches[-1]}_tok_s"))[1]
    b16 = cell(vals("llama.cpp", k, f"batch{batches[-1]}_tok_s"))[1]
    if a1 and a16:
        targets.append(f"{k[0]} {k[1]}: batch {batches[-1]} / batch 1 = {a16 / a1:.2f} (target >= 4)"
                       + (f"; batch {batches[-1]} vs llama.cpp S_TG = {a16 / b16:.2f} (target >= 2)" if b16 else ""))
copy = [r["copy_gbps"] for r in rows if r.get("copy_gbps")]
loads = [max(r["load_before"], r["load_after"]) for r in rows]
print()
print(f"Median (min–max) over rounds; * = a sample taken at 1-minute load above {cores} (the core count): "
      "contaminated. Targets: decode >= 1.0x, prefill >= 1.5x llama.cpp.")
if loads:
    print(f"Load average during the run: {min(loads):.2f}–{max(loads):.2f}.", end=" ")
if copy:
    print(f"Copy bandwidth (kvevict's STREAM-style copy, per decode run): median {statistics.median(copy):.1f} GB/s "
          f"({min(copy):.1f}–{max(copy):.1f}).")
else:
    print()
for t in targets:
    print(f"- {t}")
PY
cat "$OUT/table.md"
echo "# raw samples: $RAW; logs: $OUT/logs"
