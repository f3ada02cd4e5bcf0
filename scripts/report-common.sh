#!/usr/bin/env bash
# Shared by report-q1-protection.sh, report-q2-redundancy.sh, report-q4-beacons.sh,
# report-anomalies.sh and report-q5-throughput.sh (sourced, not run): the eval grid on the trace reasoner, one `kvevict eval` output folder per
# (task set, policy, budget) cell, so each report runs only the cells its question needs, reports
# that need the same cell share it, and a budget or policy added later leaves finished cells alone
# (kvevict eval resumes a folder rollout by rollout and refuses one made with other settings).
# Cells are combined into one summary per task set and reference policy with `kvevict merge`
# (report-lib.py combine), so every paired statistic is kvevict's own (src/eval/summary.cpp).
#
# Task sets are the main job's (scripts/main-job.sh): chain, running, once at
# ~600 trace tokens (~665 with the prompt: they test whether the prompt survives), recall with
# M = 1, 2, 4, 8 copies of a value computed in the trace and revisit with 4 re-reads (166 steps,
# ~1,260 tokens). Held-out seed 1000, greedy, one rollout, r = 32, eval seed 0 and rollouts cut at
# 2,048 tokens, as in the main job (so its 16 problems per set are this grid's first 16, rollout for rollout).
#
# Environment: MODEL (default the trace reasoner), N (problems per task set; each report sets its
# default), SET_N (per-set exceptions to N, e.g. "recall-m1=300,recall-m2=100": a report runs its
# equivalence set at the N its margin needs and the others at the N their differences need), BUDGETS (comma-separated; each report sets its default), POLICIES (override a report's
# list), JOBS (cells run side by side, default 1), THREADS (per eval, default 1), MARGIN (TOST
# equivalence margin in accuracy units, default 0.05; kvevict merge --margin).
#
# Cost: seconds per generation (one rollout, engine time; measured with N = 3 on 2026-12-03 at
# load average 2.1-2.8 on the 2 cores, two training runs beside this eval at nice 10, -t 1):
#   chain/running/once (~665 tokens), B = 128 -> 512: full 0.07; random, random-unprotected,
#   recency+prompt, h2o(+prompt), tova(+prompt) 0.05-0.07; snapkv(+prompt), vase(+prompt)
#   0.09-0.11; rkv(+prompt) 0.12-0.23.
#   recall/revisit (~1,260 tokens), B = 128 / 256 / 512 / 768: full 0.18; random 0.11 / 0.16 /
#   0.16 / 0.24; recency+prompt, h2o+prompt, tova+prompt 0.10-0.18; random-beacon 0.15-0.28;
#   snapkv+prompt, vase+prompt 0.19 / 0.27 / 0.37 / 0.39; rkv+prompt 0.26 / 0.53 / 1.03 / 1.34;
#   triattention 0.11-0.41 on recall-m1, up to 1.2 where it loops (B = 512 over the five long sets:
#   6,700 generated tokens a rollout on average, 2 of 15 rollouts at the length cap).
# So a cell of N = 300 long problems is 0.5-6.7 CPU-minutes; each report's header gives its total.
# shellcheck disable=SC2153  # N, BUDGETS, POLICIES come from the sourcing report, RUN_* from its run.env
set -euo pipefail
KV=./build/kvevict
MODEL="${MODEL:-models/trace-reasoner/trace-reasoner.gguf}"
JOBS="${JOBS:-1}"
THREADS="${THREADS:-1}"
# The grid is keyed by the model's content and by N, so two models' (or two N's) cells sit side
# by side instead of each refusing the other's folders (eval keys a folder by the model's digest
# and the task file's digest too, and refuses a mismatch).
MODEL_SHA=$(sha256sum "$MODEL" | cut -c1-12)
GRID_ROOT="${GRID_ROOT:-out/report-grid-trace}"
set_n() {  # set_n SET -> the set's N (SET_N's entry, else N)
  local kv
  for kv in ${SET_N:+${SET_N//,/ }}; do
    [ "${kv%%=*}" = "$1" ] && { echo "${kv#*=}"; return; }
  done
  echo "$N"
}
n_label() {  # n_label SET... -> "300" when every set has the same N, else "300 (a), 100 (b, c)"
  local s n out="" seen=()
  for s in "$@"; do n=$(set_n "$s"); [[ " ${seen[*]} " == *" $n "* ]] || seen+=("$n"); done
  [ "${#seen[@]}" = 1 ] && { echo "${seen[0]}"; return; }
  for n in "${seen[@]}"; do
    local names=() joined
    for s in "$@"; do [ "$(set_n "$s")" = "$n" ] && names+=("$s"); done
    joined=$(IFS=,; echo "${names[*]}")
    out+="${out:+, }$n (${joined//,/, })"
  done
  echo "$out"
}
grid_dir() { echo "$GRID_ROOT/$MODEL_SHA/n$(set_n "$1")"; }  # grid_dir SET
STATS="$GRID_ROOT/$MODEL_SHA/triattention-stats.json"  # depends on the model only
EVAL_OPTS=(--buffer 32 --temp 0 --rollouts 1 --max-length 2048 --seed 0)

# Task set name -> `kvevict tasks gen` options.
declare -A SET_GEN=(
  [chain]="--family chain --length 600"
  [running]="--family running --length 600"
  [once]="--family once --length 600"
  [recall-m1]="--family recall --steps 166 --depth 6 --restate 1"
  [recall-m2]="--family recall --steps 166 --depth 6 --restate 2"
  [recall-m4]="--family recall --steps 166 --depth 6 --restate 4"
  [recall-m8]="--family recall --steps 166 --depth 6 --restate 8"
  [revisit-m4]="--family revisit --steps 166 --depth 6 --restate 4"
)

# TriAttention's query statistics, from seed-7 tasks of every family (not the evaluation's seed
# 1000; training used 100-107), as the main job computes them.
grid_stats() {
  local g; g=$(dirname "$STATS")
  mkdir -p "$g"
  [ -f "$STATS" ] && return
  for spec in "chain --length 600" "running --length 600" "once --length 600" \
              "recall --steps 166 --restate 1,2,4,8" "revisit --steps 166 --restate 1,2,4,8"; do
    # shellcheck disable=SC2086  # spec is a family and its options
    $KV tasks gen --family $spec --count 10 --seed 7
  done | /usr/bin/python3 -c 'import json, sys
for line in sys.stdin:
    t = json.loads(line)
    sys.stdout.write(t["problem"] + t["trace"] + "\n")' > "$g/calibration.txt"
  $KV calibrate -m "$MODEL" -f "$g/calibration.txt" --tokens 40000 -o "$STATS.tmp" -c 1536 -t "$THREADS" >/dev/null
  mv "$STATS.tmp" "$STATS"
}

grid_tasks() {  # grid_tasks SET -> the set's task file (N problems, seed 1000)
  local set=$1 g; g=$(grid_dir "$set")
  [ -n "${SET_GEN[$set]:-}" ] || { echo "unknown task set '$set'" >&2; return 1; }
  mkdir -p "$g"
  # shellcheck disable=SC2086  # the set's generator options
  [ -f "$g/$set-tasks.jsonl" ] || $KV tasks gen ${SET_GEN[$set]} --count "$(set_n "$set")" --seed 1000 -o "$g/$set-tasks.jsonl"
  echo "$g/$set-tasks.jsonl"
}

cell_dir() { if [ "$2" = full ]; then echo "$(grid_dir "$1")/$1/full"; else echo "$(grid_dir "$1")/$1/$2@$3"; fi; }

# grid_cell SET POLICY B [TAG EVAL_OPTION...]: one cell (resumes; a finished cell only
# re-summarizes). With TAG, a cell run with extra eval options (e.g. a selector parameter or a
# recent buffer the grid does not vary), in the folder POLICY@B-TAG beside the grid's; a --buffer
# among them replaces EVAL_OPTS's (kvevict takes the option once).
grid_cell() {
  local set=$1 policy=$2 b=$3 tasks dir extra=() opts=("${EVAL_OPTS[@]}")
  tasks=$(grid_tasks "$set"); dir=$(cell_dir "$set" "$policy" "$b")
  if [ $# -gt 3 ]; then
    dir+="-$4"; extra+=("${@:5}")
    if [[ " ${*:5} " == *" --buffer "* ]]; then
      [ "${opts[0]}" = --buffer ] || { echo "grid_cell: EVAL_OPTS no longer starts with --buffer" >&2; return 1; }
      opts=("${opts[@]:2}")
    fi
  fi
  [[ $policy == triattention* ]] && extra+=(--param "stats=$STATS")
  mkdir -p "$(dirname "$dir")"
  nice -n "${NICE:-10}" $KV eval -m "$MODEL" -f "$tasks" --policies "$policy" --budgets "$b" --reference "$policy" \
    "${opts[@]}" "${extra[@]}" -t "$THREADS" --no-plots -o "$dir" > "$dir.log" 2>&1 ||
    { echo "eval failed: $dir (see $dir.log)" >&2; return 1; }
}

# grid_slot N: wait until fewer than N background jobs of this shell run (N = JOBS before starting
# a cell, 1 to drain); a job that failed sets GRID_FAILED=1.
GRID_FAILED=0
grid_slot() {
  while [ "$(jobs -rp | wc -l)" -ge "$1" ]; do wait -n || GRID_FAILED=1; done
}

grid_run() {  # grid_run SET POLICIES BUDGETS: every cell, JOBS at a time; fails if any cell failed
  local set=$1 p b
  grid_stats
  grid_tasks "$set" >/dev/null
  for p in ${2//,/ }; do
    for b in ${3//,/ }; do
      [ "$p" = full ] && [ "$b" != "${3%%,*}" ] && continue  # full has one cell
      grid_slot "$JOBS"
      grid_cell "$set" "$p" "$b" &
    done
  done
  grid_slot 1
  return "$GRID_FAILED"
}

# grid_save SET POLICIES BUDGETS DATA REF...: for each reference REF, one summary of the set's cells
# against REF (kvevict merge on the combined cells: paired sign test, Holm, Tango TOST with power,
# at the equivalence margin MARGIN, default 0.05 = 5 accuracy points), and the compact data the report's tables are made from, written to
# DATA/SET/: summary-vs-REF.csv, pooled-vs-REF.csv, rollouts.csv (correct per problem), cost.csv,
# stops.csv (how rollouts ended: first answer right, answered twice, at the length cap), config.json.
grid_save() {
  local set=$1 policies=$2 budgets=$3 data=$4 p b dirs=()
  shift 4
  for p in ${policies//,/ }; do
    for b in ${budgets//,/ }; do
      [ "$p" = full ] && [ "$b" != "${budgets%%,*}" ] && continue
      dirs+=("$(cell_dir "$set" "$p" "$b")")
    done
  done
  cells_save "$set" "$set" "$data/$set" "full $*" "${dirs[@]}"
}

# cells_save SET NAME DATA "REF..." CELLDIR...: grid_save's work for any list of cell folders of one
# task set (e.g. cells run with a selector parameter the grid does not vary): for each REF, the
# cells combined and summarized by kvevict merge against REF, saved to DATA (NAME keys the combined
# folders under the set's grid folder; the first REF must be full, which saves rollouts.csv).
cells_save() {
  local set=$1 name=$2 data=$3 refs=$4 ref
  shift 4
  mkdir -p "$data"
  for ref in $refs; do
    local comb; comb="$(grid_dir "$set")/combined/${REPORT:-any}/$name-vs-$ref"
    rm -rf "$comb" "$comb-in"; mkdir -p "$(dirname "$comb")"
    /usr/bin/python3 scripts/report-lib.py combine "$comb-in" "$ref" "$@"
    $KV merge "$comb-in" -o "$comb" --no-plots --margin "${MARGIN:-0.05}" > "$comb.log" 2>&1 || { echo "merge failed: $comb.log" >&2; return 1; }
    /usr/bin/python3 scripts/report-lib.py save "$comb" "$data" "$ref" "$comb-in"
  done
}

# The commands behind a report, for its header: report_commands SET... (after POLICIES, BUDGETS).
report_commands() {
  local set
  echo '```'
  for set in "$@"; do
    echo "kvevict tasks gen ${SET_GEN[$set]} --count $(set_n "$set") --seed 1000 -o $set-tasks.jsonl"
  done
  echo "# each cell: policy P in {$POLICIES}, budget B in {$BUDGETS} (full: once), per task set S"
  echo "kvevict eval -m $MODEL -f S-tasks.jsonl --policies P --budgets B --reference P ${EVAL_OPTS[*]} -t 1 -o S/P@B \\"
  echo "  # triattention adds: --param stats=triattention-stats.json (kvevict calibrate --tokens 40000 -c 1536 on seed-7 tasks of every family)"
  echo "# per task set and reference R: the cells' rollouts in one folder whose config names R, re-summarized by kvevict"
  echo "scripts/report-lib.py combine S-vs-R-in R S/*; kvevict merge S-vs-R-in -o S-vs-R --margin ${MARGIN:-0.05}"
  echo '```'
}

# report_begin REPORT [--from-data]: DATA folder; unless --from-data, clocks the run.
report_begin() {
  REPORT=$1 DATA=docs/reports/$1/data FROM_DATA=0
  [ "${2:-}" = --from-data ] && FROM_DATA=1
  [ $# -le 1 ] || { [ "$FROM_DATA" = 1 ] && [ $# -eq 2 ]; } || { echo "usage: scripts/report-$1.sh [--from-data]" >&2; exit 2; }
  if [ "$FROM_DATA" = 1 ]; then
    [ -f "$DATA/run.env" ] || { echo "$DATA/run.env: no committed data to re-make the tables from" >&2; exit 1; }
  else
    RUN_START=$(date +%s) RUN_LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
  fi
}

# report_record SET...: after the grid, the run's settings and commands beside its data.
report_record() {
  {
    printf 'RUN_%s=%q\n' N "$(n_label "$@")" BUDGETS "$BUDGETS" POLICIES "$POLICIES" MODEL "$MODEL" MODEL_SHA "$MODEL_SHA" \
      SETS "$*" LOAD0 "$RUN_LOAD0" LOAD1 "$(cut -d' ' -f1-3 /proc/loadavg)" WALL "$(( $(date +%s) - RUN_START ))" \
      DATE "$(date -u +%Y-%m-%dT%H:%MZ)" COMMIT "$(git rev-parse --short HEAD)"
  } > "$DATA/run.env"
  report_commands "$@" > "$DATA/commands.md"
}

# report_grid REF...: unless --from-data, every cell of SETS x POLICIES x BUDGETS, the report's data
# against full and each REF (grid_save), and the run's record; then, either way, the recorded run:
# its RUN_* settings (run.env), SETS as run, out (the report's folder) and runs (SET=DATA/SET, the
# arguments report-lib.py table and compare take).
report_grid() {
  local s
  if [ "$FROM_DATA" = 0 ]; then
    for s in "${SETS[@]}"; do grid_run "$s" "$POLICIES" "$BUDGETS"; done
    rm -rf "$DATA"
    for s in "${SETS[@]}"; do grid_save "$s" "$POLICIES" "$BUDGETS" "$DATA" "$@"; done
    report_record "${SETS[@]}"
  fi
  # shellcheck source=/dev/null
  source "$DATA/run.env"
  read -r -a SETS <<< "$RUN_SETS"
  out=docs/reports/$REPORT
  runs=()
  for s in "${SETS[@]}"; do runs+=("$s=$DATA/$s"); done
}

# report_header TITLE: the report's first lines, from $DATA/run.env (sourced by the caller).
report_header() {
  echo "# $1"
  echo
  echo "Made by \`scripts/report-$REPORT.sh\` at commit $RUN_COMMIT on $RUN_DATE: model \`$RUN_MODEL\` (sha256 $RUN_MODEL_SHA…),"
  echo "N = $RUN_N problems per task set (tasks seed 1000, eval seed 0, greedy, one rollout, r = 32, at most 2,048 tokens), budgets $RUN_BUDGETS;"
  local s dirs=()
  for s in $RUN_SETS; do dirs+=("$DATA/$s"); done
  echo "load $RUN_LOAD0 before, $RUN_LOAD1 after; wall $RUN_WALL s (cells already run, by this or another report, are reused,"
  echo "not re-run); $(/usr/bin/python3 scripts/report-lib.py cost "${dirs[@]}")."
  echo "The tables and plots are re-made from the committed data (\`docs/reports/$REPORT/data/\`: kvevict's summaries and"
  echo "each cell's per-problem correctness) by \`scripts/report-$REPORT.sh --from-data\`. Commands:"
  echo
  cat "$DATA/commands.md"
  echo
}

# report_reading [KEY]: the reading, only if it was written for this data: its first line names KEY,
# by default the model's sha256 prefix and N as "sha256 XXXXXXXXXXXX, N = n" (a report without a
# grid passes its own, e.g. its run's date); a reading of another run is not shown.
report_reading() {
  local f=docs/reports/readings/$REPORT.md key=${1:-"sha256 $RUN_MODEL_SHA, N = $RUN_N"}
  echo "## Reading"
  echo
  if [ -f "$f" ] && head -1 "$f" | grep -qF "$key"; then
    cat "$f"
  else
    echo "*Not written for this run yet ($f must name \"$key\" in its first line).*"
  fi
}
