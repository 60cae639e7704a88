#!/usr/bin/env python3
"""cddprun's start-up against a bare spawn, and cddprun against Debian's
torchrun, side by side in one run.

    /usr/bin/python3 tests/bench/bench_launcher.py [--build build] [--runs 40] [--torch-runs 5]
        [--startup-runs 40] [--also NAME=BUILDDIR ...] [--link-cost] [--no-torch]

Start-up (issue 22): every command run in turn, round after round, so all
see the same machine load, each timed by tests/bench/spawn.c (bench_spawn:
its clock runs from its first fork to its last reaped child, so its own
start is outside). The rows:

- baseline: a bare fork+exec of N /bin/true and a wait (bench_spawn N
  /bin/true), the least that launching N workers can cost;
- the same with each child in a session of its own (bench_spawn --setsid:
  torchrun 2.2+ and cddprun give every worker its own session, and with
  the kernel's autogroup scheduling a new session is a new scheduling
  group), and the same again from a program of its own (bench_spawn 1
  bench_spawn --setsid N /bin/true: one exec more, the least any launcher
  that is a program of its own costs); both against the baseline;
- `cddprun --nproc_per_node=N --no_python /bin/true` (bench_spawn 1 ...;
  goal: within 1.5x of the baseline);
- the same with TMPDIR on tmpfs (/dev/shm), for every build: cddprun makes
  its temporary log directories there, as torchrun does, and removes them
  at the end; the difference to the row above is the file system's share;
- `cddprun --version` against `/bin/true` alone: what exec and the dynamic
  loader cost cddprun before main() does anything.

The columns: wall time; CPU time (user + system of the process and of
everything it waited for, which depends far less than the wall time on
what else the machine runs); their medians' ratios to the baseline (a run)
or to /bin/true alone (--version); peak RSS, wait4's ru_maxrss, which for
cddprun is its own VmHWM (its workers and guardian are smaller, and the
image before exec is a fork of the small bench_spawn; goal: under 6 MiB).

--also NAME=BUILDDIR adds another build's cddprun to the same rounds (an
older commit built elsewhere, say), so builds compare side by side.
--link-cost adds empty programs linked against what cddprun links, then
with libmicrohttpd, libcurl or both: what each library costs every exec
of a program that links it, whether the run uses it or not (common/dl.h).

Against torchrun (skipped with --no-torch): three figures, each measured for
both launchers in the same run, the runs interleaved so both see the same
machine load:

1. End-to-end wall time of `--nproc_per_node=4 --no_python /bin/true`
   (torchrun with --monitor_interval=0.1, torch 2.x's default).
2. Peak RSS of the launcher. cddprun reports its own VmHWM at LOGLEVEL=DEBUG
   (wait4's ru_maxrss cannot be used for it: Linux carries the pre-exec
   image's peak into it, and that image is a fork of this Python script,
   bigger than cddprun). torchrun: wait4's ru_maxrss, which its ~240 MiB
   Python process dominates.
3. Restart latency: from rank 0's failing exit to its replacement's first
   instruction, with 4 workers whose peers stop at once on SIGTERM
   (tests/bench/restart_worker.c records CLOCK_REALTIME at both points).

It prints figures; it never passes or fails on them. Targets (issue 2):
cddprun >= 50x faster end to end, agent peak RSS < 8 MiB, restart < 20 ms;
(issue 22): start-up within 1.5x of the bare spawn, peak RSS under 6 MiB.
"""
import argparse
import os
import pathlib
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TORCH_PY = "/usr/bin/python3"
TORCHRUN = [TORCH_PY, str(ROOT / "tests" / "compat" / "torchrun_py311.py")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(cmd, env):
    """(wall seconds, ru_maxrss KiB, exit code, stderr)"""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        t1 = time.perf_counter()
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return t1 - t0, ru.ru_maxrss, p.returncode, err.read().decode(errors="replace")


def cddprun_cmd(build, *args):
    # a free master port, as for torchrun: 29500 may be taken on a shared machine
    return [str(build / "launcher" / "cddprun"), f"--master_port={free_port()}", *args]


def torchrun_cmd(*args):
    return TORCHRUN + ["--monitor_interval=0.1", f"--master_port={free_port()}", *args]


def fmt_ms(s):
    return f"{s * 1000:.1f} ms" if s < 10 else f"{s:.2f} s"


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return (f"{platform.node()}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, "
            f"load average {load[0]:.2f} at start")


def restart_latencies(cmd, env, attempts, out):
    env = dict(env, BENCH_OUT=str(out), BENCH_ATTEMPTS=str(attempts))
    if out.exists():
        out.unlink()
    _, _, rc, err = run_once(cmd, env)
    if rc != 0:
        raise SystemExit(f"restart run failed ({rc}):\n{err}")
    exits, starts = {}, {}
    for line in out.read_text().splitlines():
        what, attempt, rank, ns = line.split()
        if rank == "0":
            (exits if what == "exit" else starts)[int(attempt)] = int(ns)
    return [(starts[a + 1] - exits[a]) / 1e9 for a in sorted(exits) if a + 1 in starts]


def spawn_once(spawn, n, cmd, env, flags=()):
    """bench_spawn [flags] n cmd...: (wall seconds, largest ru_maxrss KiB, CPU seconds)."""
    r = subprocess.run([str(spawn), *flags, str(n), *cmd], env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        # the children's output went to /dev/null: run one again to show it
        again = subprocess.run(cmd, env=env, capture_output=True, text=True)
        raise SystemExit(f"{' '.join(cmd)} failed ({r.stdout.strip()}):\n{again.stderr}")
    us, rss, cpu, _ = r.stdout.split()
    return int(us) / 1e6, int(rss), int(cpu) / 1e6


# --link-cost: an empty main() linked (--no-as-needed) against each set.
LINK_SETS = [("libuv, cJSON, libm (what cddprun links)", ["-luv", "-lcjson", "-lm"]),
             ("the same + libmicrohttpd", ["-luv", "-lcjson", "-lm", "-lmicrohttpd"]),
             ("the same + libcurl", ["-luv", "-lcjson", "-lm", "-lcurl"]),
             ("the same + both", ["-luv", "-lcjson", "-lm", "-lcurl", "-lmicrohttpd"])]


def link_cost_rows(tmp):
    """Rows for --link-cost: what exec'ing a program costs for each set of
    libraries it links, its code aside (the ratio is to /bin/true alone)."""
    rows = []
    for i, (label, libs) in enumerate(LINK_SETS):
        exe = pathlib.Path(tmp) / f"empty{i}"
        subprocess.run(["cc", "-x", "c", "-", "-o", str(exe), "-Wl,--no-as-needed", *libs],
                       input="int main(void) { return 0; }\n", text=True, check=True)
        n = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout.count("\n")
        rows.append((f"empty main() linked against {label}: {n} objects in ldd", 1, [str(exe)], 1,
                     {}))
    return rows


def startup(spawn, builds, nproc, runs, env, tmpfs, extra_rows=()):
    """The start-up figures (module docstring): one table, rows in the
    order measured, every row's runs interleaved with every other's. Each
    row: (label, the row its ratio is to, command (or a function making
    it), copies started at once, extra environment[, bench_spawn's flags])."""
    rows = [(f"bare fork+exec of {nproc} x /bin/true (baseline)", None, ["/bin/true"], nproc, {}),
            ("/bin/true alone (exec floor)", None, ["/bin/true"], 1, {}),
            ("the baseline, each child in a session of its own (setsid)", 0, ["/bin/true"], nproc,
             {}, ["--setsid"]),
            ("the same from a program of its own (`bench_spawn 1 bench_spawn --setsid ...`)", 0,
             [str(spawn), "--setsid", str(nproc), "/bin/true"], 1, {})]
    rows += extra_rows
    for k, (name, build) in enumerate(builds):
        prog = str(build / "launcher" / "cddprun")

        def run_cmd(prog=prog):
            # a free master port each time: 29500 may be taken on a shared machine
            return [prog, f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
                    "--no_python", "/bin/true"]
        rows.append((f"`cddprun --nproc_per_node={nproc} /bin/true`, {name}", 0, run_cmd, 1, {}))
        if tmpfs:
            rows.append((f"the same, {name}, TMPDIR on tmpfs", 0, run_cmd, 1, {"TMPDIR": tmpfs}))
        rows.append((f"`cddprun --version`, {name}", 1, [prog, "--version"], 1, {}))
    walls = [[] for _ in rows]
    rss = [[] for _ in rows]
    cpus = [[] for _ in rows]
    for _ in range(runs):
        for i, (_, _, cmd, n, extra, *flags) in enumerate(rows):
            w, r, c = spawn_once(spawn, n, cmd() if callable(cmd) else cmd, dict(env, **extra),
                                 *flags)
            walls[i].append(w)
            rss[i].append(r)
            cpus[i].append(c)
    med = statistics.median
    print()
    print(f"start-up, {runs} rounds. wall: median; min. CPU: user + system of the process and "
          f"its children, median. ratios: of the medians, to the baseline (a run) or to "
          f"/bin/true alone (--version). peak RSS: ru_maxrss, median (max)")
    print()
    print("| command | wall | wall ratio | CPU | CPU ratio | peak RSS |")
    print("|---|---|---|---|---|---|")
    for i, (label, ref, *_) in enumerate(rows):
        wr = "-" if ref is None else f"{med(walls[i]) / med(walls[ref]):.2f}x"
        cr = "-" if ref is None else f"{med(cpus[i]) / med(cpus[ref]):.2f}x"
        print(f"| {label} | {fmt_ms(med(walls[i]))}; {fmt_ms(min(walls[i]))} | {wr} "
              f"| {fmt_ms(med(cpus[i]))} | {cr} "
              f"| {med(rss[i]) / 1024:.1f} MiB ({max(rss[i]) / 1024:.1f}) |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--runs", type=int, default=40, help="cddprun runs per figure")
    ap.add_argument("--torch-runs", type=int, default=5, help="torchrun runs per figure")
    ap.add_argument("--restarts", type=int, default=20, help="cddprun restarts measured")
    ap.add_argument("--torch-restarts", type=int, default=4)
    ap.add_argument("--startup-runs", type=int, default=40, help="rounds of the start-up figures")
    ap.add_argument("--nproc", type=int, default=4, help="workers in the start-up figures")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=BUILDDIR",
                    help="another build's cddprun in the start-up rounds (repeatable)")
    ap.add_argument("--link-cost", action="store_true",
                    help="also empty programs linked against cddprun's libraries, "
                         "libmicrohttpd and libcurl (needs cc)")
    ap.add_argument("--no-torch", action="store_true",
                    help="the start-up figures only (no torchrun, no restarts)")
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    worker = build / "tests" / "bench" / "bench_restart_worker"
    spawn = build / "tests" / "bench" / "bench_spawn"
    for b in (worker, spawn):
        if not b.exists():
            raise SystemExit(f"{b} is not built (ninja -C {build})")
    builds = [("this build", build)]
    for a in args.also:
        name, sep, d = a.partition("=")
        if not sep or not (pathlib.Path(d) / "launcher" / "cddprun").exists():
            raise SystemExit(f"--also {a}: expected NAME=BUILDDIR with launcher/cddprun built")
        builds.append((name, pathlib.Path(d).resolve()))

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=TORCH_PY)
    env.pop("LOGLEVEL", None)
    print(f"# launcher benchmark, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"# machine: {machine()}")
    # cddprun makes (and at the end removes) its temporary log directories
    # under TMPDIR, as torchrun does; a row with them on tmpfs shows what the
    # file system's part is (on an ext4 /tmp, removing a directory can wait
    # for the journal).
    with tempfile.TemporaryDirectory(prefix="bench-launcher-",
                                     dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as shm:
        startup(spawn, builds, args.nproc, args.startup_runs, env,
                shm if shm.startswith("/dev/shm/") else None,
                link_cost_rows(shm) if args.link_cost else ())
    if args.no_torch:
        return 0

    # 1 + 2: wall time and RSS, interleaved.
    c_wall, c_rss, c_self, t_wall, t_rss = [], [], [], [], []
    true_args = ["--nproc_per_node=4", "--no_python", "/bin/true"]
    for i in range(max(args.runs, args.torch_runs)):
        if i < args.runs:
            w, rss, rc, err = run_once(cddprun_cmd(build, *true_args), dict(env, LOGLEVEL="DEBUG"))
            assert rc == 0, err
            c_wall.append(w)
            c_rss.append(rss)
            m = re.search(r"peak RSS (\d+) KiB", err)
            if m:
                c_self.append(int(m.group(1)))
        if i < args.torch_runs:
            w, rss, rc, err = run_once(torchrun_cmd(*true_args), env)
            assert rc == 0, err
            t_wall.append(w)
            t_rss.append(rss)

    # 3: restart latency
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d) / "events"
        c_lat = restart_latencies(
            cddprun_cmd(build, "--nproc_per_node=4", f"--max_restarts={args.restarts}",
                        "--no_python", str(worker)), env, args.restarts + 1, out)
        t_lat = restart_latencies(
            torchrun_cmd("--nproc_per_node=4", f"--max_restarts={args.torch_restarts}",
                         "--no_python", str(worker)), env, args.torch_restarts + 1, out)

    med = statistics.median
    print()
    print("| figure | cddprun | torchrun 1.13.1 | ratio |")
    print("|---|---|---|---|")
    print(f"| wall, 4 x /bin/true (median; min) | {fmt_ms(med(c_wall))}; {fmt_ms(min(c_wall))} "
          f"| {fmt_ms(med(t_wall))}; {fmt_ms(min(t_wall))} | {med(t_wall) / med(c_wall):.0f}x |")
    if c_self:
        print(f"| launcher peak RSS (max; cddprun VmHWM, torchrun ru_maxrss) "
              f"| {max(c_self) / 1024:.1f} MiB | {max(t_rss) / 1024:.1f} MiB "
              f"| {max(t_rss) / max(c_self):.0f}x |")
    print(f"| failing exit -> replacement running (median; max) | {fmt_ms(med(c_lat))}; "
          f"{fmt_ms(max(c_lat))} | {fmt_ms(med(t_lat))}; {fmt_ms(max(t_lat))} "
          f"| {med(t_lat) / med(c_lat):.0f}x |")
    print()
    print(f"# samples: wall {len(c_wall)} cddprun / {len(t_wall)} torchrun; restarts "
          f"{len(c_lat)} / {len(t_lat)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
