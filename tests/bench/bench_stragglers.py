#!/usr/bin/env python3
"""Progress without code changes and stragglers, measured (docs/benchmarks.md,
"Automatic progress and stragglers").

    ninja -C build && /usr/bin/python3 tests/bench/bench_stragglers.py

1. The hook's cost per optimizer step. Debian's torch 1.13 steps an SGD
   optimizer over one small tensor (the cheapest real step there is)
   `--steps` times, with and without the bootstrap folder on PYTHONPATH
   (with it, lines go to a pipe this script drains, as the agent does).
   Runs alternate, `--runs` of each; the per-step time is the median of
   each run's 20 blocks; the hook's cost is the difference of the medians.
   On a loaded machine that difference is noise-bound, so the cost is also
   measured in one process: the hook's wrapper against the step it wraps,
   in alternating blocks of 200 steps (the median of the pairs'
   differences, then of the runs').
   The hook alone (its post-step function called in a loop, no optimizer)
   is timed too, as it runs (a line at most every 20 ms) and writing a line
   every step. Times are the thread's CPU time (time.thread_time), so the
   other processes of a busy machine do not count in them.
2. The agent's CPU with 64 ranks at 100 steps a second:
   `cddprun --nproc_per_node=64` over tests/bench/straggler_worker.c (a
   line with step_time_s every 10 ms: 6,400 lines/s), straggler detection
   on (the default, 1.5) and off, alternately; cddprun's own utime + stime
   (/proc/PID/stat) over a fixed interval once every worker reports.
3. The time from a rank slowing down to it being named: 8 ranks at 100
   steps a second; from its step 200, local rank 3 steps every 30 ms
   instead of 10 (it records when its first slow step began); the agent's
   A0910 line is timed as this script reads it from the agent's stderr.

It prints figures; it never passes or fails on them.
"""
import argparse
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TORCH_PY = os.environ.get("CDDP_TORCH_PYTHON") or "/usr/bin/python3"

STEP_LOOP = r"""
import os, sys, time, torch
p = torch.zeros(16, requires_grad=True)
p.grad = torch.ones(16)
opt = torch.optim.SGD([p], lr=0.01)
n = int(sys.argv[1])
blocks = []
for b in range(20):
    t0 = time.thread_time()
    for i in range(n // 20):
        opt.step()
    blocks.append((time.thread_time() - t0) / (n // 20))
blocks.sort()
print(blocks[len(blocks) // 2] * 1e6)
"""

# The same optimizer stepped through the hook's wrapper and through the
# step it wraps (torch 1.13's own), in alternating blocks of one process:
# the machine's load falls on both alike.
AB_LOOP = r"""
import sys, time, torch
p = torch.zeros(16, requires_grad=True)
p.grad = torch.ones(16)
opt = torch.optim.SGD([p], lr=0.01)
hooked = type(opt).step
plain = hooked.__wrapped__
assert getattr(hooked, "_cddp_counted", False), "the hook is not armed"
n = 200
d = []
for k in range(int(sys.argv[1]) // (2 * n)):
    t0 = time.thread_time()
    for i in range(n):
        opt.step()
    t1 = time.thread_time()
    for i in range(n):
        plain(opt)
    t2 = time.thread_time()
    d.append(((t1 - t0) - (t2 - t1)) / n)
d.sort()
print(d[len(d) // 2] * 1e6)
"""

HOOK_ALONE = r"""
import os, sys, time, importlib.util
spec = importlib.util.spec_from_file_location("boot", sys.argv[2])
boot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(boot)
import torch  # arms it (CDDP_PROGRESS_FD is the pipe)
boot._arm(sys.modules["torch.optim.optimizer"]) if boot._clock is None else None
n = int(sys.argv[1])
boot._LINE_EVERY_S = float(sys.argv[3])
t0 = time.thread_time()
for i in range(n):
    boot._stepped()
print((time.thread_time() - t0) / n * 1e6)
"""


def drained_run(args, env):
    """Runs args with CDDP_PROGRESS_FD a pipe drained by a thread; stdout."""
    r, w = os.pipe()
    env = dict(env, CDDP_PROGRESS_FD=str(w))
    got = [0]

    def drain():
        while True:
            b = os.read(r, 65536)
            if not b:
                break
            got[0] += b.count(b"\n")
    t = threading.Thread(target=drain, daemon=True)
    t.start()
    p = subprocess.run(args, env=env, pass_fds=(w,), capture_output=True, text=True, timeout=600)
    os.close(w)
    t.join(30)
    os.close(r)
    if p.returncode != 0:
        sys.exit(f"bench: {args[0]} failed: {p.stderr[-2000:]}")
    return p.stdout, got[0]


def hook_cost(build, steps, runs):
    boot = pathlib.Path(build) / "python" / "autoprogress"
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CDDP_PROGRESS_FD")}
    on, off, lines = [], [], []
    for _ in range(runs):
        out, _ = drained_run([TORCH_PY, "-c", STEP_LOOP, str(steps)], base)
        off.append(float(out))
        out, n = drained_run([TORCH_PY, "-c", STEP_LOOP, str(steps)],
                             dict(base, PYTHONPATH=str(boot)))
        on.append(float(out))
        lines.append(n)
    ab = []
    for _ in range(runs):
        out, _ = drained_run([TORCH_PY, "-c", AB_LOOP, str(steps)], dict(base, PYTHONPATH=str(boot)))
        ab.append(float(out))
    ab_diff = statistics.median(ab)
    alone = []
    for every in ("0.02", "0"):
        out, _ = drained_run([TORCH_PY, "-c", HOOK_ALONE, str(steps),
                              str(boot / "sitecustomize.py"), every], base)
        alone.append(float(out))
    return statistics.median(off), statistics.median(on), alone, min(lines), ab_diff


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_cpu(build, detection, interval, nworkers=64):
    with tempfile.TemporaryDirectory(prefix="progress-bench-") as d:
        env = dict(os.environ, BENCH_DIR=d, BENCH_PERIOD_MS="10")
        args = [f"{build}/launcher/cddprun", f"--nproc_per_node={nworkers}",
                f"--straggler_factor={'1.5' if detection else 'off'}",
                f"{build}/tests/bench/bench_straggler_worker"]
        p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)  # every worker started and reporting
            c0, t0 = cpu_seconds(p.pid), time.monotonic()
            time.sleep(interval)
            c1, t1 = cpu_seconds(p.pid), time.monotonic()
            pathlib.Path(d, "stop").write_text("")
            p.wait(timeout=60)
            return (c1 - c0) / (t1 - t0)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


def time_to_named(build, nworkers=8, slow_rank=3):
    with tempfile.TemporaryDirectory(prefix="progress-bench-") as d:
        env = dict(os.environ, BENCH_DIR=d, BENCH_PERIOD_MS="10", BENCH_SLOW_RANK=str(slow_rank),
                   BENCH_SLOW_MS="30", BENCH_SLOW_FROM="200", LOGLEVEL="INFO")
        p = subprocess.Popen([f"{build}/launcher/cddprun", f"--nproc_per_node={nworkers}",
                              f"{build}/tests/bench/bench_straggler_worker"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        named = None
        deadline = time.monotonic() + 60
        try:
            for line in p.stderr:
                if "A0910" in line and f"local_rank {slow_rank} " in line:
                    named = time.time()
                    break
                if time.monotonic() > deadline:
                    break
        finally:
            pathlib.Path(d, "stop").write_text("")
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        ev = [line.split() for line in pathlib.Path(d, "events").read_text().splitlines()]
        slow = min(int(e[3]) / 1e9 for e in ev if e[0] == "slow")
        return None if named is None else named - slow


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--steps", type=int, default=40000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--interval", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=5)
    a = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, Linux {platform.release()}, "
          f"load average {os.getloadavg()[0]:.2f} at the start")

    off, on, alone, lines, ab = hook_cost(a.build, a.steps, a.runs)
    print("| SGD step, 16 floats (torch 1.13) | us a step (median of runs) |")
    print("|---|---|")
    print(f"| without the hook | {off:.2f} |")
    print(f"| with the hook (lines at most every 20 ms to a pipe; {lines} lines read) | "
          f"{on:.2f} |")
    print(f"| the hook's cost (difference of the two processes) | {on - off:.2f} |")
    print(f"| the hook's cost in one process (its wrapper against the step it wraps, "
          f"alternating blocks) | {ab:.2f} |")
    print(f"| the hook's post-step function alone, as it runs (a line at most every 20 ms) | "
          f"{alone[0]:.2f} |")
    print(f"| the same, writing a line every step (one write(2) each) | {alone[1]:.2f} |")
    print()

    print("| round | detection off: agent CPU % of one core | --straggler_factor=1.5 |")
    print("|---|---|---|")
    offs, ons = [], []
    for k in range(a.rounds):
        c_off = agent_cpu(a.build, False, a.interval)
        c_on = agent_cpu(a.build, True, a.interval)
        offs.append(c_off)
        ons.append(c_on)
        print(f"| {k + 1} | {100 * c_off:.1f} | {100 * c_on:.1f} |")
    print(f"| median | {100 * statistics.median(offs):.1f} | {100 * statistics.median(ons):.1f} |")
    print()

    lat = [time_to_named(a.build) for _ in range(a.cycles)]
    got = [x for x in lat if x is not None]
    print("| rank 3 of 8 slows from 10 to 30 ms a step | first slow step -> A0910, s |")
    print("|---|---|")
    print(f"| each | {', '.join('-' if x is None else f'{x:.2f}' for x in lat)} |")
    if got:
        print(f"| median / max | {statistics.median(got):.2f} / {max(got):.2f} |")


if __name__ == "__main__":
    main()
