#!/usr/bin/env python3
"""The progress watchdog's benchmark (docs/benchmarks.md): how fast a hang is
caught and the group running again, and what watching costs the agent.

    ninja -C build && /usr/bin/python3 tests/bench/bench_watchdog.py [--cycles 5]

Latency: `cycles` runs of `cddprun --nproc_per_node=4 --max_restarts=1
--watchdog_timeout=1` over tests/bench/watchdog_worker.c (progress every
10 ms). On attempt 0 local rank 0 stops after 20 steps, noting the time
of its last line (CLOCK_REALTIME); from the agent's log: the hang found
(A0901) and the group stopped (A0401, written once every worker has exited);
from the workers: the first step of attempt 1. All minus the last line's
time. Once with gdb on PATH (stacks: /proc and gdb), once without (/proc
only).

Cost: `cddprun --nproc_per_node=64` whose workers report 100 lines/s each
(6,400 lines/s in all), watchdog off and `--watchdog_timeout=auto`,
alternately; the agent's CPU time (utime + stime of cddprun in
/proc/PID/stat) over a fixed interval once all workers run.
"""
import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_time(stderr, code):
    """Seconds since the epoch of the first log line with code (local time)."""
    m = re.search(r"^cddprun\[\d+\] (\d\d):(\d\d):(\d\d)\.(\d{3}) \w+ " + code, stderr, re.M)
    if not m:
        return None
    h, mi, s, ms = map(int, m.groups())
    t = time.localtime()
    midnight = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))
    return midnight + h * 3600 + mi * 60 + s + ms / 1000.0


def latency_cycle(build, with_gdb):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, BENCH_DIR=d, BENCH_PERIOD_MS="10", BENCH_STEPS="20",
                   LOGLEVEL="INFO")
        if not with_gdb:
            env["PATH"] = d  # nothing there: no gdb
        r = subprocess.run(
            [f"{build}/launcher/cddprun", "--nproc_per_node=4", "--max_restarts=1",
             "--watchdog_timeout=1", f"--master_port={free_port()}", "--log_dir", f"{d}/logs",
             f"{build}/tests/bench/bench_watchdog_worker"],
            env=env, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            sys.exit(f"cddprun failed:\n{r.stderr}")
        ev = [l.split() for l in open(f"{d}/events")]
        hang = [int(e[3]) / 1e9 for e in ev if e[0] == "hang"][0]
        first = min(int(e[3]) / 1e9 for e in ev if e[0] == "first")
        found, stopped = log_time(r.stderr, "A0901"), log_time(r.stderr, "A0401")
        return found - hang, stopped - hang, first - hang


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lines(port):
    """Progress lines the agent has read so far, all workers (from /status)."""
    st = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10).read())
    return sum((w.get("progress") or {}).get("lines", 0) for w in st["workers"])


def cost_run(build, watchdog, interval, nworkers=64):
    env = dict(os.environ, BENCH_PERIOD_MS="10", BENCH_SECONDS=str(int(interval) + 6))
    env.pop("BENCH_DIR", None)
    port = free_port()
    args = [f"{build}/launcher/cddprun", f"--nproc_per_node={nworkers}",
            f"--master_port={free_port()}", f"--status_port={port}"]
    if watchdog:
        args.append("--watchdog_timeout=auto")
    p = subprocess.Popen(args + [f"{build}/tests/bench/bench_watchdog_worker"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)  # every worker started and reporting
        l0, c0, t0 = lines(port), cpu_seconds(p.pid), time.monotonic()
        time.sleep(interval)
        c1, t1, l1 = cpu_seconds(p.pid), time.monotonic(), lines(port)
        p.wait(timeout=60)
        return (c1 - c0) / (t1 - t0), (l1 - l0) / (t1 - t0)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--interval", type=float, default=8.0, help="seconds of CPU accounting")
    ap.add_argument("--rounds", type=int, default=2, help="cost runs per mode")
    a = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, Linux {platform.release()}, "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    print("| stacks | hang -> found (A0901) p50 / max s | hang -> group stopped p50 / max s "
          "| hang -> first step of attempt 1 p50 / max s |")
    print("|---|---|---|---|")
    for with_gdb in (True, False):
        rs = [latency_cycle(a.build, with_gdb) for _ in range(a.cycles)]
        cols = []
        for k in range(3):
            xs = [r[k] for r in rs]
            cols.append(f"{statistics.median(xs):.3f} / {max(xs):.3f}")
        print(f"| {'/proc + gdb' if with_gdb else '/proc only'} | " + " | ".join(cols) + " |")
    print()
    print("| round | watchdog off: agent CPU % of one core (lines/s read) "
          "| --watchdog_timeout=auto (lines/s read) |")
    print("|---|---|---|")
    offs, ons = [], []
    for k in range(a.rounds):
        off, loff = cost_run(a.build, False, a.interval)
        on, lon = cost_run(a.build, True, a.interval)
        offs.append(off)
        ons.append(on)
        print(f"| {k + 1} | {100 * off:.1f} ({loff:.0f}) | {100 * on:.1f} ({lon:.0f}) |")
    print(f"| median | {100 * statistics.median(offs):.1f} | {100 * statistics.median(ons):.1f} |")


if __name__ == "__main__":
    main()
