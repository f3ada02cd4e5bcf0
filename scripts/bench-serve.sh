#!/usr/bin/env bash
# The serving throughput table: starts `kvevict serve` on a synthetic SmolLM2-360M-shape model
# with a fixed KV pool, drives it with `kvevict bench serve` (K concurrent streaming clients over
# loopback, one row per policy at the same B and the same pool), then stops it with SIGTERM.
# Usage:
#   scripts/bench-serve.sh [OUT_DIR]
# Environment (defaults in brackets):
#   KVEVICT [build/kvevict]  SHAPE [smollm2-360m]  TYPE [q8_0]  POOL [64MiB]  CLIENTS [10]
#   REQUESTS [10] (per policy and round)  PROMPT [128]  MAX_TOKENS [256]  BUDGET [128]  BUFFER [32]
#   THREADS [2]  PORT [18089]  POLICIES [full,random,random-shared,h2o,tova,snapkv,triattention]
#   ROUNDS [1]: the policy list runs ROUNDS times, in reverse order on even rounds, so drift in
#     the machine's speed hits every policy alike; OUT_DIR/table.md gives median (min–max) of
#     each figure over the rounds, OUT_DIR/bench.json every row (with its round).
#   TRI_STATS: TriAttention's calibration file (`kvevict calibrate`). A per-request kv_policy
#     cannot carry --param, so the server is started with --policy triattention --param
#     stats=TRI_STATS (a request naming triattention then uses them). Without it, triattention
#     is dropped from POLICIES with a note.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-serve-out}
KVEVICT=${KVEVICT:-build/kvevict}
POOL=${POOL:-64MiB} CLIENTS=${CLIENTS:-10} REQUESTS=${REQUESTS:-10} PROMPT=${PROMPT:-128}
MAX_TOKENS=${MAX_TOKENS:-256} BUDGET=${BUDGET:-128} BUFFER=${BUFFER:-32} THREADS=${THREADS:-2}
POLICIES=${POLICIES:-full,random,random-shared,h2o,tova,snapkv,triattention} PORT=${PORT:-18089}
ROUNDS=${ROUNDS:-1} TRI_STATS=${TRI_STATS:-} SHAPE=${SHAPE:-smollm2-360m} TYPE=${TYPE:-q8_0}
case "$ROUNDS" in ''|*[!0-9]*|0) echo "bench-serve: ROUNDS must be a positive integer (got '$ROUNDS')" >&2; exit 2 ;; esac
mkdir -p "$OUT"
MODEL="$OUT/$SHAPE-$TYPE.gguf"
[ -f "$MODEL" ] || "$KVEVICT" tools synth-gguf --shape "$SHAPE" --type "$TYPE" -o "$MODEL"
SERVER_ARGS=()
if [ -n "$TRI_STATS" ]; then
  [ -f "$TRI_STATS" ] || { echo "bench-serve: TRI_STATS '$TRI_STATS' not found" >&2; exit 2; }
  SERVER_ARGS=(--policy triattention --param "stats=$TRI_STATS" --budget "$BUDGET" --buffer "$BUFFER")
elif [[ ",$POLICIES," == *",triattention,"* ]]; then
  echo "bench-serve: no TRI_STATS given: triattention left out (it needs calibration statistics)" >&2
  POLICIES=$(echo ",$POLICIES," | sed 's/,triattention,/,/; s/^,//; s/,$//')
fi
"$KVEVICT" serve -m "$MODEL" --port "$PORT" --kv-memory "$POOL" --max-seqs 64 -t "$THREADS" \
  --max-tokens "$MAX_TOKENS" "${SERVER_ARGS[@]}" >"$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do grep -q "listening on" "$OUT/serve.log" && break; sleep 0.1; done
head -1 "$OUT/serve.log"
REVERSED=$(echo "$POLICIES" | tr ',' '\n' | tac | paste -sd, -)
for r in $(seq 1 "$ROUNDS"); do
  order=$POLICIES
  [ $((r % 2)) = 0 ] && order=$REVERSED
  echo "# round $r/$ROUNDS: $order (load $(cut -d' ' -f1-3 /proc/loadavg))"
  "$KVEVICT" bench serve --port "$PORT" --clients "$CLIENTS" --requests "$REQUESTS" --prompt-tokens "$PROMPT" \
    --max-tokens "$MAX_TOKENS" --budget "$BUDGET" --buffer "$BUFFER" --policies "$order" --json "$OUT/round-$r.json"
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
kill -TERM $SERVER
wait $SERVER || true
trap - EXIT
python3 - "$OUT" "$ROUNDS" "$POLICIES" > "$OUT/table.md" <<'PY'
import json, statistics, sys
out, rounds, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
rows = {}
for r in range(1, rounds + 1):
    for row in json.load(open(f"{out}/round-{r}.json"))["rows"]:
        rows.setdefault(row["policy"], []).append(row)
def cell(vals, scale=1.0, fmt="{:.1f}"):
    v = [x * scale for x in vals]
    m = statistics.median(v)
    return fmt.format(m) + (f" ({fmt.format(min(v))}–{fmt.format(max(v))})" if len(v) > 1 else ""), m
merged = None
for r in range(1, rounds + 1):
    d = json.load(open(f"{out}/round-{r}.json"))
    for row in d["rows"]:
        row["round"] = r
    if merged is None:
        merged = d
    else:
        merged["rows"] += d["rows"]
json.dump(merged, open(f"{out}/bench.json", "w"), indent=1)  # every row of every round (scripts/report-q5.py)
print(f"median (min–max) over {rounds} round(s)\n")
print("| policy | requests ok/err | output tok/s | vs random | TTFT p50 / p99 (s) | ITL p50 / p99 (ms) "
      "| peak concurrent seqs | load avg (1 min) |")
print("|---|---|---|---|---|---|---|---|")
base = statistics.median(r["output_tok_s"] for r in rows["random"]) if "random" in rows else None
for p in policies:
    rs = rows.get(p, [])
    if not rs:
        continue
    tps, m = cell([r["output_tok_s"] for r in rs])
    ratio = f"{m / base:.2f}x" if base else "–"
    t50, _ = cell([r["ttft_p50_s"] for r in rs], fmt="{:.2f}")
    t99, _ = cell([r["ttft_p99_s"] for r in rs], fmt="{:.2f}")
    i50, _ = cell([r["itl_p50_s"] for r in rs], 1000)
    i99, _ = cell([r["itl_p99_s"] for r in rs], 1000)
    ok = sum(r["ok"] for r in rs); err = sum(r["errors"] for r in rs)
    peak = max(r["peak_sequences"] for r in rs)
    load = ", ".join(f"{r['load_avg_1m']:.2f}" for r in rs)
    print(f"| {p} | {ok}/{err} | {tps} | {ratio} | {t50} / {t99} | {i50} / {i99} | {peak} | {load} |")
PY
cat "$OUT/table.md"
