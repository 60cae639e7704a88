#!/usr/bin/python3
"""Benchmark of the status port (status/http.c): requests per second
on /status, /metrics and /readyz with wrk against tests/helpers/status_testserver
(8 workers reporting progress, as an 8-GPU node's agent would), and the owner
loop's responsiveness with and without that HTTP load, then what rendering
and publishing a snapshot costs the loop (tests/bench/bench_status_render.c).

The loop figure is the round trip of one command through the test server's
libuv loop (read a line from stdin, render the view, publish the snapshot,
answer), measured side by side idle and while wrk hammers the port, so the
ratio shows what the HTTP thread costs the loop. Phase 2 measures the same
thing in cddprun as worker-exit detection latency.

It prints figures; it never passes or fails on them.

    /usr/bin/python3 tests/bench/status_http.py [--build build] [--duration 5]
        [--connections 16] [--threads 2]
"""
import argparse
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def wrk(url, args, extra=()):
    cmd = ["wrk", "--latency", "-t", str(args.threads), "-c", str(args.connections),
           "-d", f"{args.duration}s", *extra, url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return float("nan")
        v, unit = float(m.group(1)), m.group(2)
        return v * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "p50": pct(50), "p99": pct(99),
            "non2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": sock.group(1) if sock else ""}


class Server:
    def __init__(self, binary, workers):
        self.p = subprocess.Popen([binary, "--workers", str(workers), "--max-connections", "512"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  bufsize=1)
        self.port = int(self.p.stdout.readline().split()[1])
        self.lock = threading.Lock()

    def cmd(self, line):
        with self.lock:
            self.p.stdin.write(line + "\n")
            self.p.stdin.flush()
            r = self.p.stdout.readline()
        if not r.startswith("ok"):
            raise RuntimeError(f"{line!r}: {r!r}")

    def close(self):
        self.cmd("quit")
        self.p.wait(10)


def loop_rtts(srv, n, step0):
    """Round trips of progress updates through the owner loop (ms)."""
    rtts = []
    for i in range(n):
        t0 = time.perf_counter()
        srv.cmd(f'progress {i % 8} {{"step":{step0 + i},"loss":2.5,"samples_per_s":600.0}}')
        rtts.append((time.perf_counter() - t0) * 1e3)
    return rtts


def summary(ms):
    ms = sorted(ms)
    return statistics.median(ms), ms[int(len(ms) * 0.99) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loop-samples", type=int, default=2000)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("status_http.py: wrk is not installed (tools/setup.sh --test installs it)")
    binary = pathlib.Path(args.build) / "tests" / "helpers" / "status_testserver"
    if not binary.exists():
        sys.exit(f"status_http.py: {binary} is not built")

    srv = Server(str(binary), 8)
    srv.cmd("state running")
    for lr in range(8):
        srv.cmd(f'progress {lr} {{"step":100,"epoch":1,"loss":2.31,"samples_per_s":612.5}}')
    base = f"http://127.0.0.1:{srv.port}"
    sizes = {p: len(subprocess.run(["curl", "-s", base + p], capture_output=True).stdout)
             for p in ("/status", "/metrics", "/readyz")}

    print(f"# status port benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}")
    print(f"# wrk -t{args.threads} -c{args.connections} -d{args.duration}s, "
          "server: status_testserver --workers 8 (8 workers with progress)")
    print()
    print("| endpoint | body bytes | connections | req/s | p50 ms | p99 ms | non-2xx |")
    print("|---|---|---|---|---|---|---|")
    for path in ("/status", "/metrics", "/readyz"):
        for keep in (True, False):
            r = wrk(base + path, args, () if keep else ("-H", "Connection: close"))
            print(f"| {path} | {sizes[path]} | {'keep-alive' if keep else 'one per request'} "
                  f"| {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['non2xx']}"
                  + (f" ({r['socket_errors']})" if r["socket_errors"] else "") + " |")

    # The owner loop, idle and under load, side by side.
    idle = loop_rtts(srv, args.loop_samples, 1000)
    result = {}

    def load():
        result["wrk"] = wrk(base + "/status", args)

    t = threading.Thread(target=load)
    t.start()
    time.sleep(0.5)
    loaded = []
    while t.is_alive():
        loaded += loop_rtts(srv, 100, 100000 + len(loaded))
    t.join()
    i50, i99 = summary(idle)
    l50, l99 = summary(loaded)
    print()
    print("| owner loop round trip (progress line -> render -> publish) | samples | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    print(f"| idle | {len(idle)} | {i50:.3f} | {i99:.3f} |")
    print(f"| during wrk on /status ({result['wrk']['rps']:.0f} req/s) | {len(loaded)} "
          f"| {l50:.3f} | {l99:.3f} |")
    print(f"| ratio loaded/idle | | {l50 / i50:.2f} | {l99 / i99:.2f} |")
    srv.close()

    render = pathlib.Path(args.build) / "tests" / "bench" / "bench_status_render"
    if render.exists():
        print()
        print(subprocess.run([str(render)], capture_output=True, text=True, check=True).stdout,
              end="")


if __name__ == "__main__":
    main()
