#!/usr/bin/env python3
"""Node loss -> the survivors' workers running again, with real cddprun agents.

    /usr/bin/python3 tests/bench/bench_elastic.py [--build build] [--nodes 4] [--nproc 2] \
        [--trials 10]

Each trial starts N real cddprun agents on this machine (one per "node",
--nnodes=N-1:N, --nproc_per_node=NPROC, the c10d backend), waits until all
N x NPROC workers run in one round, then SIGKILLs one agent and measures,
from the kill, until the first and the last of the survivors' workers have
started again in the new, smaller round (tests/bench/elastic_worker.c
records CLOCK_REALTIME as its first act; its SIGTERM handler exits at once,
so stopping the old workers costs nothing measurable here; with real
training processes their own exit time adds to this).

Two setups, trials interleaved so both see the same machine load:
  daemon:  the agents meet at a cddp-rdzv daemon; the killed node is node 0
           (the worst case: MASTER_ADDR/PORT move to a new node 0)
  hosted:  agent 0 hosts the rendezvous in-process (is_host=1); the killed
           node is the last one

The path being measured: the kernel closes the killed agent's socket -> the
server sees the connection drop and pushes "restart" to every survivor ->
each survivor SIGTERMs its workers, sees them exit (SIGCHLD), joins the next
round -> the round completes as soon as every survivor has rejoined -> each
starts its workers. Torchrun has no such path: its survivors wait for an
NCCL/gloo timeout (pytorch/pytorch#111646).

It prints figures; it never passes or fails on them. Target (issue 3):
node loss -> new round with workers running in under 1 s.
"""
import argparse
import os
import pathlib
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def starts(path):
    """[(node, world, rank, master_port, ns)] recorded so far."""
    out = []
    try:
        text = pathlib.Path(path).read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        f = line.split()
        if len(f) == 6 and f[0] == "start":
            out.append((f[1], int(f[2]), int(f[3]), f[4], int(f[5])))
    return out


def wait_round(path, world, exclude, after_ns=0, timeout=30.0):
    """The starts of a round of this world size (not one in exclude), all
    after after_ns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        by = {}
        for s in starts(path):
            if s[4] > after_ns:
                by.setdefault(s[3], []).append(s)
        for port, group in by.items():
            if port not in exclude and len(group) == world and all(s[1] == world for s in group):
                return group
        time.sleep(0.002)
    raise RuntimeError(f"no round of world size {world} within {timeout}s ({path})")


def trial(build, setup, nodes, nproc, tmp, daemon_port):
    out = tmp / f"{setup}.{time.monotonic_ns()}.txt"
    cddprun = build / "launcher" / "cddprun"
    worker = build / "tests" / "bench" / "bench_elastic_worker"
    conf = "last_call_timeout=0"
    if setup == "daemon":
        port = daemon_port
    else:
        port = free_port()
    agents = []
    try:
        for i in range(nodes):
            c = conf + (",is_host=0" if setup == "daemon" or i > 0 else ",is_host=1")
            env = dict(os.environ, NODE=str(i), BENCH_OUT=str(out), LOGLEVEL="INFO",
                       TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5")
            log = open(tmp / f"{out.stem}.agent{i}.log", "w")
            p = subprocess.Popen(
                [str(cddprun), f"--nnodes={nodes - 1}:{nodes}", f"--nproc_per_node={nproc}",
                 "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                 f"--rdzv_id={setup}-{out.name}", f"--rdzv_conf={c}", str(worker)],
                env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
            log.close()
            agents.append(p)
            if setup == "hosted" and i == 0:
                time.sleep(0.05)  # let it bind first (is_host=0 agents retry anyway)
        wait_round(out, nodes * nproc, set())
        # Rounds formed while the agents were starting (scale-up) are not it.
        before = {s[3] for s in starts(out)}
        victim = 0 if setup == "daemon" else nodes - 1
        t_kill = time.time_ns()
        os.kill(agents[victim].pid, signal.SIGKILL)
        second = wait_round(out, (nodes - 1) * nproc, before, t_kill)
        survivors = {s[0] for s in second}
        assert str(victim) not in survivors, "the killed node is not in the new round"
        times = [s[4] for s in second]
        return (min(times) - t_kill) / 1e6, (max(times) - t_kill) / 1e6
    except Exception:
        for i in range(len(agents)):
            sys.stderr.write(f"--- agent {i}:\n" + (tmp / f"{out.stem}.agent{i}.log").read_text())
        raise
    finally:
        # Non-hosts first: the host would close the rendezvous for them.
        for p in reversed(agents):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def summary(xs):
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]
    return f"median {statistics.median(xs):7.1f}   p90 {p90:7.1f}   min {xs[0]:7.1f}   max {xs[-1]:7.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--trials", type=int, default=10)
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    for b in (build / "launcher" / "cddprun", build / "rendezvous" / "cddp-rdzv",
              build / "tests" / "bench" / "bench_elastic_worker"):
        if not os.access(b, os.X_OK):
            sys.exit(f"bench_elastic: {b} not built (run tools/setup.sh)")
    if args.nodes < 2:
        sys.exit("bench_elastic: --nodes must be at least 2")

    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        daemon = subprocess.Popen([str(build / "rendezvous" / "cddp-rdzv"), "--host", "127.0.0.1",
                                   "--port", "0"], stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            line = daemon.stdout.readline()
            daemon_port = int(line.strip().rsplit(":", 1)[1])
            res = {"daemon": ([], []), "hosted": ([], [])}
            for _ in range(args.trials):
                for setup in ("daemon", "hosted"):
                    first, last = trial(build, setup, args.nodes, args.nproc, tmp, daemon_port)
                    res[setup][0].append(first)
                    res[setup][1].append(last)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=20)

    load = os.getloadavg()
    print(f"bench_elastic: {args.nodes} agents x {args.nproc} workers, {args.trials} trials, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f}")
    print("SIGKILL of one agent -> the survivors' workers started again in the new round (ms)")
    for setup, what in (("daemon", "cddp-rdzv, node 0 killed"),
                        ("hosted", "in-process host, last node killed")):
        first, last = res[setup]
        print(f"  {what:36s} first worker: {summary(first)}")
        print(f"  {'':36s} last worker:  {summary(last)}")


if __name__ == "__main__":
    main()
