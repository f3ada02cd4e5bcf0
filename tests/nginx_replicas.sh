#!/usr/bin/env bash
# nginx in front of two `kvevict serve` replicas, with docs/nginx-kvevict.conf as documented
# (ports replaced by free ones; all files in a temporary directory; no root). Load goes through
# nginx from 8 clients (streamed and non-streamed completions); one replica is killed (SIGKILL)
# mid-run. Pass: every request either completes (finish_reason, and `data: [DONE]` for a stream)
# or ends in a clean error (an HTTP error status, or a stream whose connection closes before
# [DONE]: what a client sees when its replica dies); no request hangs or ends as a silently
# truncated success; a second load after the kill completes in full (nginx skips the dead
# replica: passive health checks, and retries a request whose connection to it fails); nginx
# and the other replica still answer /health.
# Exit 77 (ctest: skipped) when nginx is not installed (1 under CI=true, where setup.sh --test installs it).
# Usage: tests/nginx_replicas.sh KVEVICT_BINARY [SOURCE_DIR]
set -euo pipefail
BIN=${1:?usage: nginx_replicas.sh KVEVICT_BINARY [SOURCE_DIR]}
SRC=${2:-$(cd "$(dirname "$0")/.." && pwd)}
NGINX=$(command -v nginx || true)
[ -n "$NGINX" ] || { [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx; }
if [ -z "$NGINX" ]; then
  echo "SKIP: nginx is not installed (scripts/setup.sh --test installs Debian's nginx-light)"
  [ "${CI:-}" = "true" ] && { echo "CI=true: nginx is required here" >&2; exit 1; }
  exit 77
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-nginx.XXXXXX")
PIDS=()
cleanup() {
  # Replicas start inside $(...) subshells, so their pids reach us through $T/*.pid, not PIDS
  # (a replica left running after every run was seen).
  for f in "$T"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
mkdir -p "$T/tmp"

# A replica on a free port (--port 0); prints its port.
start_replica() {
  local name=$1
  "$BIN" serve -m "$SRC/models/reasoner/reasoner.gguf" --port 0 --kv-memory 64MiB -t 1 --max-seqs 16 \
    --shutdown-grace 0 >"$T/$name.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$T/$name.pid"
  for _ in $(seq 200); do
    if grep -q "listening on" "$T/$name.log"; then
      sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$T/$name.log" | head -1
      return 0
    fi
    sleep 0.05
  done
  echo "replica $name did not start:" >&2
  cat "$T/$name.log" >&2
  return 1
}
PA=$(start_replica a)
PB=$(start_replica b)
PN=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

sed -e "s/127\.0\.0\.1:8081/127.0.0.1:$PA/" -e "s/127\.0\.0\.1:8082/127.0.0.1:$PB/" \
  -e "s/listen 127\.0\.0\.1:8080/listen 127.0.0.1:$PN/" "$SRC/docs/nginx-kvevict.conf" >"$T/nginx.conf"
for want in "127.0.0.1:$PA " "127.0.0.1:$PB " "listen 127.0.0.1:$PN;"; do
  grep -qF "$want" "$T/nginx.conf" || { echo "docs/nginx-kvevict.conf: could not set '$want'" >&2; exit 1; }
done
"$NGINX" -p "$T" -c "$T/nginx.conf" -e "$T/error.log" &
PIDS+=($!)

python3 - "$PN" "$(cat "$T/b.pid")" <<'PY'
import http.client, json, os, signal, socket, sys, threading, time

port, victim = int(sys.argv[1]), int(sys.argv[2])
def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()

for _ in range(100):
    try:
        if get("/health")[0] == 200:
            break
    except OSError:
        pass
    time.sleep(0.05)
else:
    sys.exit("nginx did not come up")

N_CLIENTS, N_REQUESTS, KILL_AFTER, MAX_TOKENS = 8, 48, 16, 256
lock = threading.Lock()
next_i = [0]

def read_stream(sock):
    """Reads a chunked SSE answer off the raw socket (http.client's readline turns a connection cut
    mid-chunk into a quiet end of stream). Returns (status, events, ended): ended is True when the
    terminating zero-length chunk arrived, False when the connection closed before it."""
    buf = b""
    def fill():
        nonlocal buf
        d = sock.recv(65536)
        if not d:
            raise EOFError
        buf += d
    try:
        while b"\r\n\r\n" not in buf:
            fill()
        head, buf = buf.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        if b"transfer-encoding: chunked" not in head.lower():
            return status, [], True
        body = b""
        while True:
            while b"\r\n" not in buf:
                fill()
            size_line, buf = buf.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(buf) < size + 2:
                fill()
            body += buf[:size]
            buf = buf[size + 2:]
            if size == 0:
                return status, body.decode().split("\n\n"), True
    except EOFError:
        return None, [], False

def one(i):
    stream = i % 2 == 0
    body = {"prompt": "AB\nCD\n", "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.7, "seed": i}
    try:
        if stream:
            body["stream"] = True
            data = json.dumps(body).encode()
            s = socket.create_connection(("127.0.0.1", port), timeout=20)
            try:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                          b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
                status, events, ended = read_stream(s)
            finally:
                s.close()
            if not ended:
                return "clean_error", "connection closed before the end of the answer"
            if status != 200:
                return "clean_error", f"HTTP {status}"
            finish, done = None, False
            for ev in events:
                ev = ev.strip()
                if ev == "data: [DONE]":
                    done = True
                elif ev.startswith("data: "):
                    j = json.loads(ev[6:])
                    if "error" in j:
                        return "clean_error", "error event"
                    for ch in j.get("choices", []):
                        finish = ch.get("finish_reason") or finish
            if done and finish:
                return "complete", ""
            return "broken", "stream ended (terminating chunk) without [DONE] and without an error"
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        try:
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            payload = r.read()
            if r.status != 200:
                return "clean_error", f"HTTP {r.status}"
            j = json.loads(payload)
            ok = j["choices"][0]["finish_reason"] in ("length", "stop")
            return ("complete", "") if ok else ("broken", json.dumps(j)[:200])
        finally:
            c.close()
    except (http.client.IncompleteRead, ConnectionError) as e:
        return "clean_error", f"connection closed mid-answer ({type(e).__name__})"
    except TimeoutError:
        return "broken", "timed out (hang)"
    except (OSError, ValueError) as e:
        return "broken", f"{type(e).__name__}: {e}"

def client(results, n_requests, kill_at):
    while True:
        with lock:
            i = next_i[0]
            if i >= n_requests:
                return
            next_i[0] += 1
            if i == kill_at:
                os.kill(victim, signal.SIGKILL)
        outcome, detail = one(i)
        with lock:
            results.append((i, outcome, detail))

def run(n_requests, kill_at=-1):
    results = []
    next_i[0] = 0
    threads = [threading.Thread(target=client, args=(results, n_requests, kill_at)) for _ in range(N_CLIENTS)]
    for th in threads: th.start()
    for th in threads: th.join()
    return results

# Phase 1: the load, replica B killed when request KILL_AFTER starts (7 others are in flight).
t0 = time.monotonic()
during = run(N_REQUESTS, KILL_AFTER)
# Phase 2: the same load once the kill is over: every request must complete.
after = run(N_REQUESTS // 2)
wall = time.monotonic() - t0

count = lambda rs, o: sum(1 for r in rs if r[1] == o)
print(f"[nginx replicas] {len(during)} requests around the kill: {count(during, 'complete')} complete, "
      f"{count(during, 'clean_error')} clean errors, {count(during, 'broken')} broken; {len(after)} after it: "
      f"{count(after, 'complete')} complete; {wall:.1f} s, load average {os.getloadavg()[0]:.2f}")
for r in during + after:
    if r[1] != "complete":
        print("  ", r[1], r[2])
fail = []
if len(during) != N_REQUESTS or len(after) != N_REQUESTS // 2: fail.append("not every request ran")
if count(during, "broken") or count(after, "broken"): fail.append("a request hung or ended as a truncated success")
if count(after, "complete") != len(after): fail.append("a request after the kill did not complete")
if get("/health")[0] != 200: fail.append("/health through nginx is not 200")
if fail:
    sys.exit("FAIL: " + "; ".join(fail))
PY
echo "nginx replicas: OK"
