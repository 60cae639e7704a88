#!/usr/bin/env python3
"""Recovery times of cddprun and cddp-rdzv for the faults of docs/reliability.md.

    /usr/bin/python3 tests/bench/bench_recovery.py [--build build] [--trials 3] [--only NAME,...]

Real cddprun agents and a real cddp-rdzv on loopback; the workers are a
shell script that records CLOCK_REALTIME (date +%s%N) when it starts and
when it fails or hangs, and otherwise reports a step on its progress
channel every 0.1 s. Each scenario measures, per trial:

  worker_crash    rank 0 exits 1 (--max_restarts=1, 2 workers): from its
                  exit to the first worker of the next attempt running
  worker_hang     rank 0 stops reporting progress (--watchdog_timeout=1):
                  from its last report to the next attempt running (the
                  1 s timeout included)
  cddprun_kill    cddprun SIGKILLed: until its last worker is gone
  agent_kill      one of two agents (--nnodes=1:2, cddp-rdzv) SIGKILLed:
                  until the survivor's workers of the new round run
  rdzv_kill       cddp-rdzv SIGKILLed and started again on its port: from
                  the new one listening until both agents have re-registered
                  their round (status page: connected, one reconnection);
                  worker restarts must stay 0
  rdzv_graceful   the same with SIGUSR2 (stop for a successor), from the
                  old one's exit... from the new one listening
  garbage         64 KiB of random bytes to cddp-rdzv's port and to an
                  agent's status port while the job runs: until each closes
                  that connection; worker restarts must stay 0

It prints figures; it never passes or fails on them (docs/benchmarks.md).
"""
import argparse
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]

WORKER = r"""#!/bin/sh
# start/exit/hang lines: <what> <node> <restart count> <local rank> <pid> <ns>
log() { echo "$1 $NODE $TORCHELASTIC_RESTART_COUNT $LOCAL_RANK $$ $(date +%s%N)" >> "$OUT"; }
log start
i=0
while :; do
    if [ "$LOCAL_RANK" = 0 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ $i = 5 ]; then
        case "$MODE" in
        crash) log exit; exit 1 ;;
        hang) log hang; exec sleep 3600 ;;
        esac
    fi
    echo "{\"step\":$i}" >&"$CDDP_PROGRESS_FD"
    i=$((i + 1))
    sleep 0.1
done
"""

FAST = "keep_alive_interval=0.2,keep_alive_max_attempt=3,last_call_timeout=0.5"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout=30.0, interval=0.002, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_REALTIME)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Bench:
    def __init__(self, build, tmp):
        self.build = build
        self.tmp = tmp
        self.procs = []
        self.worker = tmp / "worker.sh"
        self.worker.write_text(WORKER)
        self.worker.chmod(0o755)
        self.n = 0

    def lines(self, out):
        try:
            return [ln.split() for ln in out.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return []

    def spawn(self, cmd, env=None, log=None, stdout=subprocess.DEVNULL):
        e = dict(os.environ, **(env or {}))
        fh = open(log, "w") if log else subprocess.DEVNULL
        p = subprocess.Popen(cmd, env=e, stdout=stdout, stderr=fh, start_new_session=True)
        self.procs.append(p)
        return p

    def agent(self, out, node, args, mode="run", sport=None):
        cmd = [str(self.build / "launcher" / "cddprun"), *args]
        if sport:
            cmd.append(f"--status_port={sport}")
        cmd.append(str(self.worker))
        return self.spawn(cmd, env={"OUT": str(out), "NODE": node, "MODE": mode,
                                    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2", "LOGLEVEL": "INFO"},
                          log=out.with_suffix(f".{node}.log"))

    def rdzv(self, port, *extra):
        p = self.spawn([str(self.build / "rendezvous" / "cddp-rdzv"), "--host", "127.0.0.1",
                        "--port", str(port), *extra], stdout=subprocess.PIPE)
        line = p.stdout.readline().decode()
        assert "listening on" in line, line
        return p, now_ns()

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs = []

    def out(self):
        self.n += 1
        return self.tmp / f"run{self.n}.txt"

    # ---- single node ----

    def restart_after(self, mode, extra):
        out = self.out()
        self.agent(out, "0", ["--nproc_per_node=2", "--max_restarts=1", *extra], mode=mode)
        starts = wait_for(lambda: [ln for ln in self.lines(out)
                                   if ln[0] == "start" and ln[2] == "1"], what="attempt 1")
        fault = [ln for ln in self.lines(out) if ln[0] in ("exit", "hang")][0]
        return (min(int(ln[5]) for ln in starts) - int(fault[5])) / 1e6

    def worker_crash(self):
        return self.restart_after("crash", []), "counted against --max_restarts"

    def worker_hang(self):
        return self.restart_after("hang", ["--watchdog_timeout=1"]), "timeout 1 s included"

    def cddprun_kill(self):
        out = self.out()
        p = self.agent(out, "0", ["--nproc_per_node=2"])
        starts = wait_for(lambda: [ln for ln in self.lines(out) if ln[0] == "start"][1:] and
                          [ln for ln in self.lines(out) if ln[0] == "start"], what="2 workers")
        pids = [int(ln[4]) for ln in starts]
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGKILL)
        wait_for(lambda: not any(alive(x) for x in pids), interval=0.0005, what="workers gone")
        return (time.monotonic() - t0) * 1000, "no orphan left"

    # ---- two nodes, cddp-rdzv ----

    def two_nodes(self):
        port = free_port()
        d, _ = self.rdzv(port)
        out = self.out()
        sports = [free_port(), free_port()]
        agents = [self.agent(out, str(i),
                             ["--nnodes=1:2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                              f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench",
                              "--rdzv_conf=is_host=0," + FAST], sport=sports[i])
                  for i in range(2)]
        wait_for(lambda: len([ln for ln in self.lines(out) if ln[0] == "start"]) == 4,
                 what="4 workers")
        wait_for(lambda: all(self.status(s)["workers"][0]["progress"] for s in sports),
                 what="steps reported")
        return port, d, out, agents, sports

    def status(self, sport):
        with urllib.request.urlopen(f"http://127.0.0.1:{sport}/status", timeout=5) as r:
            return json.loads(r.read())

    def restarts(self, sports):
        return sum(self.status(s)["restarts"]["count"] +
                   sum(w["restarts"] for w in self.status(s)["workers"]) for s in sports)

    def agent_kill(self):
        port, d, out, agents, sports = self.two_nodes()
        t0 = now_ns()
        os.killpg(agents[1].pid, signal.SIGKILL)
        new = wait_for(lambda: [ln for ln in self.lines(out)
                                if ln[0] == "start" and ln[1] == "0" and int(ln[5]) > t0][1:],
                       what="the survivor's new round")
        return (max(int(ln[5]) for ln in new) - t0) / 1e6, "not counted"

    def rdzv_restart(self, stop):
        port, d, out, agents, sports = self.two_nodes()
        starts = len(self.lines(out))
        stop(d)
        d, t0 = self.rdzv(port)

        def back():
            sts = [self.status(s) for s in sports]
            return all(s["rdzv"]["connected"] and s["rdzv"]["reconnects"] == 1 for s in sts)
        wait_for(back, interval=0.001, what="both agents back")
        took = (now_ns() - t0) / 1e6
        time.sleep(1.0)  # past resume_timeout (0.6 s): nothing may follow
        again = len(self.lines(out)) - starts
        return took, f"worker restarts: {self.restarts(sports) + again}"

    def rdzv_kill(self):
        def kill(d):
            d.kill()
            d.wait()
        return self.rdzv_restart(kill)

    def rdzv_graceful(self):
        def usr2(d):
            d.send_signal(signal.SIGUSR2)
            assert d.wait(timeout=20) == 0
        return self.rdzv_restart(usr2)

    def garbage(self):
        port, d, out, agents, sports = self.two_nodes()
        starts = len(self.lines(out))
        worst = 0.0
        for target in (port, sports[0]):
            s = socket.create_connection(("127.0.0.1", target))
            s.settimeout(10)
            t0 = time.monotonic()
            try:
                s.sendall(os.urandom(65536))
                while s.recv(65536):
                    pass
            except (ConnectionResetError, BrokenPipeError):
                pass
            worst = max(worst, (time.monotonic() - t0) * 1000)
            s.close()
        time.sleep(0.5)
        again = len(self.lines(out)) - starts
        return worst, f"worker restarts: {self.restarts(sports) + again}"


SCENARIOS = ["worker_crash", "worker_hang", "cddprun_kill", "agent_kill", "rdzv_kill",
             "rdzv_graceful", "garbage"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or SCENARIOS
    build = pathlib.Path(a.build).resolve()
    print(f"bench_recovery: {os.cpu_count()} CPUs, {a.trials} trials, build {build}")
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(build, pathlib.Path(tmp))
        for name in names:
            ms, notes = [], set()
            for _ in range(a.trials):
                try:
                    t, note = getattr(b, name)()
                    ms.append(t)
                    notes.add(note)
                finally:
                    b.cleanup()
            print(f"{name:14s} median {statistics.median(ms):8.1f} ms  min {min(ms):8.1f}  "
                  f"max {max(ms):8.1f}  ({'; '.join(sorted(notes))})")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
