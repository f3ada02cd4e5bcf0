#!/usr/bin/env python3
"""The hostile-client cases of `kvevict serve`'s HTTP layer, measured against a running binary.

Each case starts a fresh `kvevict serve` (so its peak RSS, VmHWM in /proc/PID/status, belongs to
that case alone), sends what a hostile or unusual client sends, and prints one line: what came
back, the wall time, and the server's peak RSS against its RSS right after start-up. These are the
figures docs/serving.md quotes; the pass/fail versions of the same cases are GoogleTests
(tests/serve_http_test.cpp).

    python3 tools/http_cases.py [--bin build/kvevict] [--model models/reasoner/reasoner.gguf] [CASE...]

Cases: nested, quote, chunked, line, lines4, headers, slowloris, idle1000, pipeline, sse.
Standard library only; loopback only.
"""
import argparse
import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time

CASES = ["nested", "quote", "chunked", "line", "lines4", "headers", "slowloris", "idle1000", "pipeline", "sse"]


def rss_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


class Server:
    def __init__(self, binary, model, extra):
        self.proc = subprocess.Popen(
            [binary, "serve", "-m", model, "--port", "0", "--kv-memory", "64MiB", "-t", "1"] + extra,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            raise SystemExit(f"server did not start: {line!r}")
        self.port = int(m.group(1))
        # Drain the rest of the output so the server never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        time.sleep(0.2)
        self.rss0 = rss_kib(self.proc.pid, "VmRSS")

    def alive(self):
        return self.proc.poll() is None

    def peak_mib(self):
        return rss_kib(self.proc.pid, "VmHWM") / 1024.0

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def connect(port, src="127.0.0.1", timeout=10):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def read_all(s, limit=1 << 20):
    out = b""
    try:
        while len(out) < limit:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def status_of(raw):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
    return int(m.group(1)) if m else None


def send_and_read(port, data, timeout=30):
    """Sends data (bytes or an iterable of bytes) and reads the answer; returns (status, raw, error)."""
    s = connect(port, timeout=timeout)
    err = ""
    try:
        for part in ([data] if isinstance(data, bytes) else data):
            s.sendall(part)
    except OSError as e:  # the server may answer and close before the whole request was sent
        err = type(e).__name__
    raw = read_all(s)
    s.close()
    return status_of(raw), raw, err


def health_time(port, src="127.0.0.1", timeout=10):
    t = time.monotonic()
    try:
        s = connect(port, src, timeout)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = read_all(s)
        s.close()
        st = status_of(raw)
    except OSError as e:
        st = type(e).__name__
    return st, time.monotonic() - t


def case_nested(srv):
    body = b'{"prompt":"Hi","model":' + b"[" * 100000 + b"]" * 100000 + b"}"
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    st, raw, _ = send_and_read(srv.port, req)
    time.sleep(0.3)
    msg = raw.split(b"\r\n\r\n", 1)[-1][:160].decode("utf-8", "replace")
    return f"status {st}, server {'alive' if srv.alive() else 'DEAD'}, body {msg!r}"


def case_quote(srv):
    # A 1 MiB string where an integer belongs: the 400 must quote a short prefix, not the value.
    body = json.dumps({"prompt": "Hi", "max_tokens": "z" * (1 << 20)}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    st, raw, _ = send_and_read(srv.port, req)
    answer = raw.split(b"\r\n\r\n", 1)[-1]
    msg = json.loads(answer)["error"]["message"] if st == 400 else answer[:160]
    return f"status {st}, 1 MiB bad value, answer body {len(answer)} bytes, message {msg[:100]!r} ({len(msg)} bytes)"


def case_chunked(srv):
    mib = 64
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")

    def parts():
        yield head
        first = b'{"prompt":"Hi","max_tokens":1,"pad":"'
        yield b"%x\r\n%s\r\n" % (len(first), first)
        block = b"a" * (1 << 20)
        for _ in range(mib):
            yield b"%x\r\n%s\r\n" % (len(block), block)
        yield b'2\r\n"}\r\n0\r\n\r\n'

    st, raw, err = send_and_read(srv.port, parts(), timeout=60)
    return f"status {st}{' (send: ' + err + ')' if err else ''}, {mib} MiB chunked body"


def long_line(port, mib, out, i):
    def parts():
        yield b"GET /"
        block = b"a" * (1 << 20)
        for _ in range(mib):
            yield block
        yield b" HTTP/1.1\r\nHost: x\r\n\r\n"

    out[i] = send_and_read(port, parts(), timeout=120)


def case_line(srv):
    out = [None]
    long_line(srv.port, 256, out, 0)
    st, _, err = out[0]
    return f"status {st}{' (send: ' + err + ')' if err else ''}, 256 MiB request line"


def case_lines4(srv):
    out = [None] * 4
    th = [threading.Thread(target=long_line, args=(srv.port, 128, out, i)) for i in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return "statuses " + ", ".join(str(o[0]) for o in out) + ", 4 connections x 128 MiB request lines"


def case_headers(srv):
    # 64 MiB of headers: 8,192 headers of 8 KiB each.
    def parts():
        yield b"GET /health HTTP/1.1\r\nHost: x\r\n"
        value = b"v" * 8192
        for i in range(8192):
            yield b"X-Pad-%d: %s\r\n" % (i, value)
        yield b"\r\n"

    st, _, err = send_and_read(srv.port, parts(), timeout=60)
    many = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(2000)) + b"\r\n"
    st2, _, err2 = send_and_read(srv.port, many)
    return (f"status {st}{' (send: ' + err + ')' if err else ''} for 64 MiB of headers; "
            f"status {st2}{' (send: ' + err2 + ')' if err2 else ''} for 2,000 small headers")


def case_slowloris(srv, n=340):
    conns = []
    for _ in range(n):
        try:
            s = connect(srv.port, timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            conns.append(s)
        except OSError:
            break
    stop = threading.Event()

    def trickle():  # one header byte per connection every second
        while not stop.is_set():
            for s in conns:
                try:
                    s.send(b"X")
                except OSError:
                    pass
            stop.wait(1.0)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    time.sleep(1.5)
    st, dt = health_time(srv.port)
    st2, dt2 = health_time(srv.port, "127.0.0.9")
    stop.set()
    t.join()
    for s in conns:
        s.close()
    return (f"{len(conns)} slow connections from 127.0.0.1; /health from 127.0.0.1 -> {st} in {dt:.3f} s, "
            f"from 127.0.0.9 -> {st2} in {dt2:.3f} s")


def case_idle1000(srv, n=1000):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
    conns = []
    # Spread over 4 loopback addresses so a per-address cap (if any) is not what is measured.
    for i in range(n):
        try:
            conns.append(connect(srv.port, f"127.0.0.{2 + i % 4}", timeout=5))
        except OSError as e:
            return f"could not open connection {i}: {e}"
    time.sleep(1.0)
    st, dt = health_time(srv.port)
    for s in conns:
        s.close()
    return f"{n} idle connections open; /health -> {st} in {dt:.3f} s"


def case_pipeline(srv):
    body = b'{"prompt":"AB","max_tokens":2,"seed":1}'
    one = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    two = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    t = time.monotonic()
    s = connect(srv.port, timeout=10)
    s.sendall(one + two)
    raw = read_all(s)
    s.close()
    dt = time.monotonic() - t
    answers = re.findall(rb"HTTP/1\.1 (\d{3})", raw)
    return f"answers {[int(a) for a in answers]} in {dt:.3f} s"


def case_sse(srv):
    body = json.dumps({"prompt": "AB\n", "max_tokens": 2000, "ignore_eos": True, "stream": True}).encode()
    s = connect(srv.port, timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while got.count(b"data: ") < 5:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    t = time.monotonic()
    cancelled = used = None
    while time.monotonic() - t < 10:
        st, raw, _ = send_and_read(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        page = raw.decode("utf-8", "replace")
        m1 = re.search(r"^kvevict:requests_cancelled_total (\S+)", page, re.M)
        m2 = re.search(r"^kvevict:kv_pool_used_bytes (\S+)", page, re.M)
        cancelled, used = (float(m1.group(1)) if m1 else None), (float(m2.group(1)) if m2 else None)
        if cancelled == 1 and used == 0:
            break
        time.sleep(0.05)
    return (f"{got.count(b'data: ')} events, then hung up; cancelled_total {cancelled}, pool used {used} "
            f"after {time.monotonic() - t:.3f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/kvevict")
    ap.add_argument("--model", default="models/reasoner/reasoner.gguf")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `kvevict serve` argument")
    ap.add_argument("cases", nargs="*", default=CASES)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    for name in a.cases:
        if name not in CASES:
            raise SystemExit(f"unknown case {name!r} (valid: {', '.join(CASES)})")
        srv = Server(a.bin, a.model, a.serve_arg)
        t = time.monotonic()
        try:
            what = globals()["case_" + name](srv)
        except Exception as e:  # a case that breaks the client is reported, not hidden
            what = f"client error {type(e).__name__}: {e}"
        dt = time.monotonic() - t
        h = health_time(srv.port, timeout=5)
        print(f"{name:10s} {what} | {dt:.2f} s | peak RSS {srv.peak_mib():.0f} MiB (start {srv.rss0 / 1024:.0f} MiB)"
              f" | /health after: {h[0]} in {h[1]:.3f} s | server {'alive' if srv.alive() else 'DEAD'}", flush=True)
        srv.stop()


if __name__ == "__main__":
    main()
