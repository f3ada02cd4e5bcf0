#!/usr/bin/env bash
# Runs the example commands of README.md and of every docs/*.md page as a new user would, from the
# repository root, and fails when one breaks. An example is a line starting with "$ " inside a ``` block (continued by trailing
# backslashes). A command whose shown output starts with "kvevict: error:" must exit 2 and print
# exactly that line; every other command must exit 0. Commands run in README order (the
# calibrate example writes what the generate example after it reads).
#
# It also checks, when out/main-job/summary.md (written by scripts/main-job.sh) exists, that
# docs/results.md holds that table and that every row of README's short table is one of its rows.
#
# Usage: scripts/check-readme.sh [--fast] [--list] [FILE.md ...]   (default: README.md docs/*.md)
#   --fast  skip the examples listed in SLOW below (CTest runs this; ~1 min on 2 busy cores)
#   --list  print the commands it would run, run nothing
# Needs ./build/kvevict (scripts/build.sh; KVEVICT_BIN=PATH runs another build in its place) and
# the shared models in ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
list=0
files=()
for a in "$@"; do
  case "$a" in
    --fast) fast=1 ;;
    --list) list=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) files+=("$a") ;;
  esac
done
BIN="${KVEVICT_BIN:-./build/kvevict}"
[ -x "$BIN" ] || { echo "check-readme: $BIN not found (run scripts/build.sh)" >&2; exit 2; }
mkdir -p out

# Substrings of the examples --fast skips: each takes more than ~15 s on a busy 2-core machine.
SLOW='--tokens 8192
--limit 20 --rollouts 2
eval -m models/reasoner/reasoner.gguf
--trials 10
--arch qwen3 --type q8_0'

if [ "${#files[@]}" -eq 0 ]; then files=(README.md docs/*.md); fi

BIN="$BIN" FAST="$fast" LIST="$list" SLOW="$SLOW" python3 - "${files[@]}" <<'PY'
import os, re, subprocess, sys, time

fast, list_only = os.environ["FAST"] == "1", os.environ["LIST"] == "1"
slow = [s for s in os.environ["SLOW"].split("\n") if s]

# Collect (file, line number, command, expected first output line) from ``` blocks, in file order.
examples = []
texts = {}
for readme in sys.argv[1:]:
    in_block = False
    lines = open(readme, encoding="utf-8").read().split("\n")
    texts[readme] = lines
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_block = not in_block
            i += 1
            continue
        if in_block and line.startswith("$ "):
            start = i + 1
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
            first_out = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("```") else ""
            examples.append((readme, start, cmd, first_out))
        i += 1

failed = 0
ran = 0
for readme, lineno, cmd, first_out in examples:
    # A server example (kvevict serve, curl against it, bench serve) needs a server running in
    # another terminal; tests/serve_*.cpp start one and send these requests.
    if "serve" in cmd.split("|")[0].split() or "serve-bench" in cmd or cmd.startswith("curl "):
        print(f"skip (server) {readme}:{lineno}: {cmd[:100]}")
        continue
    if fast and any(s in cmd for s in slow):
        print(f"skip (slow)  {readme}:{lineno}: {cmd[:100]}")
        continue
    if list_only:
        print(f"{readme}:{lineno}: {cmd}")
        continue
    expect_error = first_out.startswith("kvevict: error:")
    t0 = time.time()
    run = cmd.replace("./build/kvevict", os.environ["BIN"]).replace(" build/kvevict", " " + os.environ["BIN"])
    p = subprocess.run(["bash", "-c", run], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=dict(os.environ, KVEVICT_PROGRESS="0"))
    secs = time.time() - t0
    ran += 1
    ok = p.returncode == 0
    why = f"exit {p.returncode}"
    if expect_error:
        err = p.stderr.strip().split("\n")[0] if p.stderr.strip() else ""
        ok = p.returncode == 2 and err == first_out.strip()
        why = f"exit {p.returncode}, printed {err!r}, README shows {first_out.strip()!r}"
    print(f"{'ok  ' if ok else 'FAIL'} ({secs:5.1f} s)  {readme}:{lineno}: {cmd[:100]}")
    if not ok:
        failed += 1
        print(f"      {why}")
        tail = (p.stderr or p.stdout).strip().split("\n")[-3:]
        for t in tail:
            print(f"      | {t}")
table = "out/main-job/summary.md"
if not list_only and os.path.exists(table):
    want = open(table, encoding="utf-8").read().strip()
    if "docs/results.md" in texts:
        same = want in "\n".join(texts["docs/results.md"])
        print(f"{'ok  ' if same else 'FAIL'}           docs/results.md holds {table}")
        failed += 0 if same else 1
    if "README.md" in texts:
        rows = set(l.strip() for l in want.split("\n") if l.startswith("| "))
        body = [l.strip() for l in texts["README.md"] if l.startswith("| ") and l.strip() not in rows]
        # README's short table: its data rows (after the header of the table that starts with
        # "| policy | B |") must be rows of the full table.
        rl = texts["README.md"]
        missing = []
        for k, l in enumerate(rl):
            if l.startswith("| policy | B |"):
                for m in rl[k + 2:]:
                    if not m.startswith("| "):
                        break
                    if m.strip() not in rows:
                        missing.append(m.strip())
        ok = not missing
        print(f"{'ok  ' if ok else 'FAIL'}           README's main-job rows are rows of {table}" +
              ("" if ok else f" (not found: {missing[0]!r})"))
        failed += 0 if ok else 1
if not list_only:
    print(f"check-readme: {ran - failed}/{ran} examples ran as written")
sys.exit(1 if failed else 0)
PY
