#!/usr/bin/env python3
"""Recovery in place, with and without a warm spare, against a group restart,
side by side (issue 26).

    /usr/bin/python3 tests/bench/bench_inplace.py [--build build] [--trials 1]
        [--crash-step 5] [--ckpt-every 4] [--image-size 32]
        [--hang [--hang-ranks 2-3] --collective-timeout 3] [--nodes 2]

ResNet-18 on synthetic data, 4 ranks, CPU gloo, under cddprun; rank 2
crashes as step N begins (--fault crash@step=N,rank=2). Three ways to
recover, each measured from the crash (cddp-train's T6101 line) to the
start of the recovered group's first step (the last rank to begin it: its
T0002 end less its time) and to its end (the last rank to end it):

  worker  --restart_scope=worker, no --checkpoint: rank 2 alone is started
          again and the others re-form in place and hand it their state
          (docs/distributed.md, "Recovering in place"); 1 step recomputed
          (the one that failed)
  worker+spare  the same with --spare_workers=1: a started spare takes
          rank 2's place (docs/distributed.md, "Warm spares")
  group   --restart_scope=group (torchrun's) with --checkpoint
          --ckpt-every K: every rank is stopped, started again and reads
          the checkpoint; up to K steps recomputed

Every run must end on the same state checksum (T6202); the bench says so.
For the two in-place runs it prints the recovery's timeline (median
seconds from the crash to each event in the logs).

With --hang, rank 2 hangs instead (--fault hang@step=N,rank=2) under
--restart_scope=worker with --collective-timeout T: the others' collective
times out, they name rank 2 to the agent, which kills it and replaces it
in place (with --spare, --spare_workers=1: a warm spare takes its place).
Measured from the hang (T6102) to the first step the recovered
group completes (T0002), and each survivor's T6211 figure (from the start
of the collective that timed out to re-formed); the target is T + 1 s.
--hang-ranks 2-3 hangs ranks 2 and 3 together (a node's ranks): the agent
kills both and replaces them together in one generation.

With --nodes 2, the same on two agents on this machine (--nnodes=2, 2
workers each, the c10d rendezvous hosted by the first), and rank 3 (node
1's second worker) is the one that fails: under worker scope its agent
asks the rendezvous for the generation, node 0 announces it
(docs/multi-node.md, "A worker restarted alone"); under group every rank
on both nodes restarts.

It prints figures; it never passes or fails on them (docs/benchmarks.md).
"""
import argparse
import datetime
import os
import pathlib
import re
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRASH_RANK = 2
TS = r"(\d\d):(\d\d):(\d\d)\.(\d\d\d)"


def secs(m):
    h, mi, s, ms = (int(x) for x in m)
    return h * 3600 + mi * 60 + s + ms / 1000.0


def lines(err, pattern):
    """(time, match) for each log line matching pattern, in order."""
    out = []
    for ln in err.splitlines():
        t = re.search(TS, ln)
        m = re.search(pattern, ln)
        if t and m:
            out.append((secs(t.groups()), m))
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NODES = 1


def run(build, args, extra, env):
    if NODES == 1:
        cmds = [[str(build / "launcher" / "cddprun"), "--nproc_per_node=4", "--max_restarts=1",
                 f"--master_port={free_port()}", *extra,
                 str(build / "trainer" / "cddp-train"), *args]]
    else:
        port = free_port()
        cmds = [[str(build / "launcher" / "cddprun"), "--nnodes=2", "--nproc_per_node=2",
                 "--max_restarts=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                 f"--rdzv_id=bench{port}", f"--rdzv_conf=is_host={1 - i}", *extra,
                 str(build / "trainer" / "cddp-train"), *args] for i in range(2)]
    procs = []
    for i, cmd in enumerate(cmds):
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
        if i == 0 and len(cmds) > 1:
            import time
            time.sleep(0.3)  # (the host binds first)
    errs = [p.communicate(timeout=900)[1] for p in procs]
    for cmd, p, err in zip(cmds, procs, errs):
        if p.returncode != 0:
            sys.exit(f"bench_inplace: {' '.join(cmd)} exited {p.returncode}:\n{err[-4000:]}")
    return "".join(errs)


def first_step(err, crash_step, after, group):
    """(start, end) of the recovered group's first step: every rank's
    first step ending after `after` (a group restart) or the step that
    failed, redone (in place: T0002 counts steps done); its start is its
    end less its time. Start: the last rank to begin it (the group
    re-formed); end: the last rank to end it."""
    ends = {}
    for t, m in lines(err, r"cddp-train\[\d+\] rank(\d) .*T0002: step (\d+) loss \S+ time ([\d.]+) s"):
        rank, step, dur = int(m.group(1)), int(m.group(2)), float(m.group(3))
        ok = t > after if group else step == crash_step + 1
        if ok and rank not in ends:
            ends[rank] = (t - dur, t)
    return max(v[0] for v in ends.values()), max(v[1] for v in ends.values())


def at(err, pattern, pick=min, after=0.0):
    ts = [t for t, _ in lines(err, pattern) if t >= after]
    return pick(ts) if ts else float("nan")


def timeline(err, crash_step, spare):
    """The recovery's events in place, in seconds from the crash."""
    crash = at(err, rf"T6101: fault injection: crash at step {crash_step}")
    restart = at(err, r"A0220: .*restarting local_rank")
    ev = {
        "agent sees the exit (A0503)": at(err, r"A0503: failed"),
        **({"agent asks the rendezvous for the generation (A0234)": at(err, r"A0234: "),
            "node 0 heard it granted and announced it (A0236)": at(err, r"A0236: ")}
           if NODES == 2 else {}),
        "generation announced, replacement started or spare assigned (A0220)": restart,
        "survivors notice the failure (first T6210)": at(err, r"T6210: "),
        "replacement ready: spare read its assignment (T6221) or new process made its "
        "model (T0001)": (at(err, r"T6221: spare: taking over") if spare
                          else at(err, rf"rank{CRASH_RANK} .*T0001: ", after=restart)),
        "new gloo group connected (last T6223)": at(err, r"T6223: generation 1", max),
        "state transferred and checked (last T6212)": at(err, r"T6212: generation 1", max),
    }
    s, e = first_step(err, crash_step, 0, False)
    ev["first step starts (last rank)"] = s
    ev["first step ends (last rank)"] = e
    return {k: v - crash for k, v in ev.items()}


def measure(err, crash_step, group):
    """(to the first step's start, to its end, checksums), from the crash."""
    crash = min(t for t, _ in lines(err, rf"T6101: fault injection: crash at step {crash_step}"))
    after = min(t for t, _ in lines(err, r"A0207: .*\(attempt 1,")) if group else 0
    s, e = first_step(err, crash_step, after, group)
    sums = {m.group(1) for _, m in lines(err, r"T6202: after \d+ steps: state checksum (\w+)")}
    return s - crash, e - crash, sums


def hang(o, build, env, base):
    """--hang: the worker-scope recovery of a hung rank, o.trials times."""
    args = [a for a in base if not a.startswith("crash@")][:-1]
    args += ["--fault", f"hang@step={o.crash_step},rank={o.hang_ranks}",
             "--collective-timeout", str(o.collective_timeout)]
    totals, reforms, starts, sums = [], [], [], set()
    for trial in range(o.trials):
        flags = ["--restart_scope=worker"] + (["--spare_workers=1"] if o.spare else [])
        err = run(build, args, flags, env)
        hung = min(t for t, _ in lines(err, rf"T6102: fault injection: hang at step "
                                            rf"{o.crash_step}"))
        first = min(t for t, m in lines(err, r"T0002: step (\d+) loss")
                    if int(m.group(1)) == o.crash_step + 1)
        took = [float(m.group(1)) for _, m in lines(
            err, r"T6211: rank \d re-formed generation 1 in [\d.]+ s \(([\d.]+) s after")]
        sums |= {m.group(1) for _, m in lines(err, r"T6202: after \d+ steps: state checksum "
                                                   r"(\w+)")}
        started = max(t for t, _ in lines(err, r"(A0220: .*restarting local_rank|A0246: )"))
        starts.append(started - hung)
        totals.append(first - hung)
        reforms.append(max(took) if took else float("nan"))
        print(f"trial {trial}: hang to the replacement's start (A0220) {starts[-1]:.3f} s; "
              f"hang to the recovered group's first step {first - hung:.3f} s; "
              f"collective start to re-formed (slowest survivor) {reforms[-1]:.3f} s")
    print(f"\nResNet-18, synthetic {o.image_size}x{o.image_size}, 4 ranks, CPU gloo, rank "
          f"{o.hang_ranks} hangs at step {o.crash_step}, --collective-timeout {o.collective_timeout}"
          f"{', --spare_workers=1' if o.spare else ''}, median "
          f"of {o.trials}:")
    print("| from | to | time |")
    print("|---|---|---|")
    print(f"| the hang (T6102) | the (last) replacement started (A0220) | "
          f"{statistics.median(starts):.3f} s |")
    print(f"| the failed collective's start (T6211) | re-formed | "
          f"{statistics.median(reforms):.3f} s |")
    print(f"| the hang (T6102) | the recovered group's first step (T0002) | "
          f"{statistics.median(totals):.3f} s |")
    print(f"checksums: {', '.join(sorted(sums))} ({datetime.date.today()})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--crash-step", type=int, default=5)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--hang", action="store_true")
    ap.add_argument("--collective-timeout", type=float, default=3.0)
    ap.add_argument("--nodes", type=int, choices=(1, 2), default=1)
    ap.add_argument("--hang-ranks", default="2",
                    help="with --hang: the rank, or R-S, the ranks that hang together")
    ap.add_argument("--spare", action="store_true",
                    help="with --hang: --spare_workers=1 (a warm spare takes the hung rank's place)")
    o = ap.parse_args()
    global NODES, CRASH_RANK
    NODES, CRASH_RANK = o.nodes, 2 if o.nodes == 1 else 3
    if o.hang and o.nodes != 1:
        ap.error("--hang runs on one node (--nodes 1)")
    build = pathlib.Path(o.build)
    env = dict(os.environ, LOGLEVEL="DEBUG")
    steps = o.crash_step + 3
    base = ["--arch", "resnet18", "--data", "synthetic", "--image-size", str(o.image_size),
            "--num-classes", "10", "--num-samples", str(16 * steps), "--batch-size", "4",
            "--epochs", "1", "--fault", f"crash@step={o.crash_step},rank={CRASH_RANK}"]
    kinds = {
        "worker": (["--restart_scope=worker"], False),
        "worker+spare": (["--restart_scope=worker", "--spare_workers=1"], False),
        "group": (["--restart_scope=group"], True),
    }
    rows = {k: [] for k in kinds}
    tls = {"worker": [], "worker+spare": []}
    if o.hang:
        return hang(o, build, env, base)
    for trial in range(o.trials):
        sums = set()
        for kind, (flags, group) in kinds.items():
            with tempfile.TemporaryDirectory() as tmp:
                extra = (["--checkpoint", os.path.join(tmp, "ck.safetensors"), "--ckpt-every",
                          str(o.ckpt_every)] if group else [])
                err = run(build, base + extra, flags, env)
            s, e, sw = measure(err, o.crash_step, group)
            rows[kind].append((s, e))
            sums |= sw
            if kind in tls:
                tls[kind].append(timeline(err, o.crash_step, kind == "worker+spare"))
        print(f"trial {trial}: " + ", ".join(f"{k} {rows[k][-1][0]:.3f} s / {rows[k][-1][1]:.3f} s"
                                            for k in kinds)
              + f" (to the first step's start / end); checksums "
              f"{'equal' if len(sums) == 1 else 'DIFFER'} ({', '.join(sorted(sums))})")
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
           for k, v in rows.items()}
    last_ckpt = (o.crash_step // o.ckpt_every) * o.ckpt_every
    print(f"\nResNet-18, synthetic {o.image_size}x{o.image_size}, 4 ranks"
          f"{' on 2 nodes' if NODES == 2 else ''}, CPU gloo, crash of rank {CRASH_RANK} at step "
          f"{o.crash_step}, median of {o.trials} ({datetime.date.today()}):")
    print("| recovery | failure to the re-formed group's first step: start | ... its end | "
          "steps recomputed |")
    print("|---|---|---|---|")
    print(f"| --restart_scope=worker | {med['worker'][0]:.3f} s | {med['worker'][1]:.3f} s | 1 |")
    print(f"| --restart_scope=worker --spare_workers=1 | {med['worker+spare'][0]:.3f} s | "
          f"{med['worker+spare'][1]:.3f} s | 1 |")
    print(f"| --restart_scope=group --checkpoint --ckpt-every {o.ckpt_every} | "
          f"{med['group'][0]:.3f} s | {med['group'][1]:.3f} s | {o.crash_step - last_ckpt + 1} |")
    for k in ("worker", "worker+spare"):
        print(f"group/{k}: {med['group'][0] / med[k][0]:.2f}x to the start, "
              f"{med['group'][1] / med[k][1]:.2f}x to the end")
    for kind, tl in tls.items():
        print(f"\ntimeline of --restart_scope={kind} (median seconds from the crash, T6101):")
        for key in tl[0]:
            print(f"  {statistics.median(t[key] for t in tl):7.3f}  {key}")


if __name__ == "__main__":
    main()
