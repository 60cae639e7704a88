#!/usr/bin/python3
"""Benchmark of cddprun's status port with real workers: requests per second
on /status and /metrics (wrk) while 8 workers run and report progress every
10 ms, and the agent's exit-detection latency with and without that HTTP
load, side by side in one run.

    ninja -C build && /usr/bin/python3 tests/bench/status_agent.py [--build build]
        [--duration 5] [--cycles 40] [--connections 16] [--threads 2]

Exit detection: in each cycle, local rank 0 of the 8 workers
(tests/bench/status_worker.c) records CLOCK_REALTIME just before it exits 1;
the agent records when it reaped it (its waitpid, on SIGCHLD), served as
cddp_worker_last_exit_timestamp_seconds at full precision. The difference is
the latency. The peers record when the agent's SIGTERM reaches them, so the
reaction (exit -> group stop) is printed too. The agent restarts the group
(--max_restarts) and the next cycle begins. Cycles alternate in blocks
between three modes, so all see the same machine:

  idle     nobody but the bench, which polls /status (a few hundred
           requests per second) to follow the cycles in every mode;
  control  the same wrk against another process's status port (the test
           server, tests/helpers/status_testserver): the CPU the load takes
           from the agent, without touching the agent;
  load     wrk against cddprun's own status port.

On a machine with spare cores the three agree; where wrk and its server
take every core (2 shared cores here), control shows what is CPU
contention, and load minus control is what the status port itself costs.

It prints figures; it never passes or fails on them. Target (issue 4):
more than 5,000 req/s on /status with no measurable change in exit-detection
latency.
"""
import argparse
import http.client
import json
import os
import pathlib
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def wrk_parse(out):
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return float("nan")
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]

    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "p50": pct(50), "p99": pct(99),
            "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": sock.group(1) if sock else ""}


def wrk_cmd(url, args, duration, extra=()):
    return ["wrk", "--latency", "-t", str(args.threads), "-c", str(args.connections),
            "-d", f"{duration}s", *extra, url]


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def status(port):
    code, body = get(port, "/status")
    return json.loads(body) if code == 200 else None


def metric(port, name, **labels):
    _, body = get(port, "/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in body.decode().splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.split()[-1])
    return None


def wait_until(pred, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            sys.exit(f"status_agent.py: timed out waiting for {what}")
        time.sleep(0.002)


def events(path):
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            what, attempt, rank, ns = line.split()
            out.setdefault((what, int(attempt)), {})[int(rank)] = int(ns)
    return out


def pcts(us):
    s = sorted(us)
    return statistics.median(s), s[max(0, int(len(s) * 0.9) - 1)], s[-1]


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{platform.node()}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, "
            f"load average {os.getloadavg()[0]:.2f} at the start")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk measurement")
    ap.add_argument("--cycles", type=int, default=60,
                    help="exits measured, a third in each mode")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("status_agent.py: wrk is not installed (tools/setup.sh installs it)")
    build = pathlib.Path(args.build)
    cddprun = build / "launcher" / "cddprun"
    worker = build / "tests" / "bench" / "bench_status_worker"
    testserver = build / "tests" / "helpers" / "status_testserver"
    for b in (cddprun, worker, testserver):
        if not b.exists():
            sys.exit(f"status_agent.py: {b} is not built")

    cycles = args.cycles - args.cycles % 6 or 6
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="cddp-status-bench-"))
    env = dict(os.environ, BENCH_DIR=str(tmp), BENCH_ATTEMPTS=str(cycles + 1),
               BENCH_PERIOD_MS="10", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="10", LOGLEVEL="WARNING")
    errf = open(tmp / "cddprun.err", "w")
    control = None
    agent = subprocess.Popen(
        [str(cddprun), f"--nproc_per_node={args.workers}", f"--max_restarts={cycles}",
         "--status_port=0", "--log_dir=/dev/null", "--no_python", str(worker)],
        env=env, stdout=subprocess.DEVNULL, stderr=errf, start_new_session=True)
    try:
        m = wait_until(lambda: re.search(r"picked free port (\d+)",
                                         (tmp / "cddprun.err").read_text()),
                       what="the S0001 line")
        port = int(m.group(1))
        base = f"http://127.0.0.1:{port}"

        def running(round_):
            def pred():
                st = status(port)
                return st if st and st["state"] == "running" and st["round"] == round_ and all(
                    w["pid"] and w["progress"] for w in st["workers"]) else None
            return pred

        wait_until(running(1), what="the workers")
        sizes = {p: len(get(port, p)[1]) for p in ("/status", "/metrics")}
        print(f"# cddprun status port benchmark, {time.strftime('%Y-%m-%d %H:%M')}")
        print(f"# {machine()}")
        print(f"# cddprun --nproc_per_node={args.workers} --status_port=0, workers report "
              "progress every 10 ms; wrk "
              f"-t{args.threads} -c{args.connections} -d{args.duration}s --latency")
        print()
        print("| endpoint | body bytes | connections | req/s | p50 ms | p99 ms | non-2xx |")
        print("|---|---|---|---|---|---|---|")
        for path, keep in (("/status", True), ("/status", False), ("/metrics", True)):
            extra = () if keep else ("-H", "Connection: close")
            out = subprocess.run(wrk_cmd(base + path, args, args.duration, extra),
                                 capture_output=True, text=True, check=True).stdout
            r = wrk_parse(out)
            print(f"| {path} | {sizes[path]} | {'keep-alive' if keep else 'one per request'} "
                  f"| {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['non2xx']}"
                  + (f" ({r['socket_errors']})" if r["socket_errors"] else "") + " |")

        # The control: the same status port code in another process.
        control = subprocess.Popen([str(testserver), "--workers", str(args.workers)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True, bufsize=1)
        control_base = f"http://127.0.0.1:{control.stdout.readline().split()[1]}"
        for cmd in ["state running"] + [
                f'progress {lr} {{"step":100,"epoch":1,"loss":2.31,"samples_per_s":612.5}}'
                for lr in range(args.workers)]:
            control.stdin.write(cmd + "\n")
            control.stdin.flush()
            control.stdout.readline()

        # Exit detection: blocks of cycles in the three modes, twice over.
        modes = ("idle", "control", "load")
        lat = {m: [] for m in modes}
        react = {m: [] for m in modes}
        rps_of = {m: [] for m in modes}
        attempt = 0
        block = cycles // 6
        for mode in modes + modes:
            wrk = None
            if mode != "idle":
                url = (control_base if mode == "control" else base) + "/status"
                wrk = subprocess.Popen(wrk_cmd(url, args, 3600), stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True)
                time.sleep(0.5)
            for _ in range(block):
                wait_until(running(attempt + 1), what=f"attempt {attempt}")
                (tmp / f"go.{attempt}").touch()
                wait_until(running(attempt + 2), what=f"attempt {attempt + 1}")
                agent_ts = metric(port, "cddp_worker_last_exit_timestamp_seconds",
                                  local_rank="0")
                ev = events(tmp / "events")
                exit_ns = ev[("exit", attempt)][0]
                lat[mode].append((agent_ts - exit_ns / 1e9) * 1e6)
                terms = ev.get(("term", attempt), {})
                if terms:
                    react[mode].append((min(terms.values()) - exit_ns) / 1e3)
                attempt += 1
            if wrk:
                wrk.send_signal(signal.SIGINT)
                out, _ = wrk.communicate(timeout=30)
                try:
                    rps_of[mode].append(wrk_parse(out)["rps"])
                except AttributeError:
                    pass
        (tmp / f"go.{attempt}").touch()
        rc = agent.wait(60)
        control.stdin.close()
        control.wait(10)

        def rps(mode):
            return f"{statistics.mean(rps_of[mode]):.0f} req/s" if rps_of[mode] else "wrk"

        print()
        print("| exit detection (worker's last instruction -> agent's waitpid) | exits "
              "| p50 us | p90 us | max us | exit -> SIGTERM at peers, p50 us |")
        print("|---|---|---|---|---|---|")
        labels = {"idle": "idle (the bench's own polling only)",
                  "control": f"wrk on another process's status port ({rps('control')})",
                  "load": f"wrk on cddprun's /status ({rps('load')})"}
        for mode in modes:
            p50, p90, mx = pcts(lat[mode])
            r50 = statistics.median(react[mode]) if react[mode] else float("nan")
            print(f"| {labels[mode]} | {len(lat[mode])} | {p50:.0f} | {p90:.0f} | {mx:.0f} "
                  f"| {r50:.0f} |")
        med = {m: statistics.median(lat[m]) for m in modes}
        print(f"| p50 ratios: load/idle {med['load'] / med['idle']:.2f}, "
              f"control/idle {med['control'] / med['idle']:.2f}, "
              f"load/control {med['load'] / med['control']:.2f} | | | | | |")
        print()
        print(f"# cddprun exited {rc} after {attempt} restarts")
    finally:
        if control and control.poll() is None:
            control.kill()
            control.wait()
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
        errf.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
