#!/usr/bin/env python3
"""Time to first token of a repeated prompt with and without the prompt cache (--prompt-cache).

Starts two `kvevict serve` on the same model, one with the cache and one without, and sends the
same prompt (PROMPT random token ids, fixed seed) alternately to each, one request at a time, so
both see the same machine load. The cache-on server's first request fills the cache (a miss,
reported apart); every later one is a hit. Prints the load average, each TTFT and the medians with
min-max. Usage:

    scripts/bench-prompt-cache.py MODEL.gguf [--prompt 1024] [--budget 512] [--reps 10] [--threads 2]

TTFT is measured by the client: from sending the request to the first streamed event.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import time


def start(kvevict, model, port, extra, threads, budget, log):
    cmd = [kvevict, "serve", "-m", model, "--port", str(port), "-t", str(threads), "--kv-memory", "1GiB",
           "--policy", "random", "-B", str(budget)] + extra
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        time.sleep(0.1)
    p.terminate()
    sys.exit(f"server on port {port} did not come up")


def ttft(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {r.read()[:300]!r}")
    first = None
    usage = None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if first is None:
            first = time.perf_counter() - t0
        if line == b"data: [DONE]":
            break
        j = json.loads(line[6:])
        if j.get("usage"):
            usage = j["usage"]
    return first, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--kvevict", default="build/kvevict")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=18140)
    a = ap.parse_args()
    log = open(os.devnull, "w")
    on = start(a.kvevict, a.model, a.port, ["--prompt-cache", "256MiB"], a.threads, a.budget, log)
    off = start(a.kvevict, a.model, a.port + 1, [], a.threads, a.budget, log)
    try:
        vocab = 100  # ids below 100 exist in every vocabulary
        rng = random.Random(1)
        ids = [rng.randrange(3, vocab) for _ in range(a.prompt)]
        body = {"prompt": ids, "max_tokens": 2, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        print("load average before:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
        fill, u = ttft(a.port, body)
        print(f"cache-on first request (miss, fills the cache): {fill:.3f} s, cached_tokens "
              f"{u['prompt_tokens_details']['cached_tokens']}")
        hits, misses = [], []
        for i in range(a.reps):
            t_off, u_off = ttft(a.port + 1, body)
            t_on, u_on = ttft(a.port, body)
            assert u_on["prompt_tokens_details"]["cached_tokens"] == a.prompt, u_on
            assert u_off["prompt_tokens_details"]["cached_tokens"] == 0, u_off
            misses.append(t_off)
            hits.append(t_on)
            print(f"rep {i}: off {t_off:.3f} s  on (hit) {t_on:.4f} s")
        print("load average after:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
        for name, v in (("cache off", misses), ("cache hit", hits)):
            print(f"{name}: median {statistics.median(v):.4f} s (min {min(v):.4f}, max {max(v):.4f}), n = {len(v)}")
        print(f"speed-up of the median: {statistics.median(misses) / statistics.median(hits):.1f}x")
    finally:
        for p in (on, off):
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
