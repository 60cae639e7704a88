#!/usr/bin/env python3
"""Recovery in place against a group restart, side by side (issue 26).

    /usr/bin/python3 tests/bench/bench_inplace.py [--build build] [--trials 1]
        [--crash-step 5] [--ckpt-every 4] [--image-size 32]

ResNet-18 on synthetic data, 4 ranks, CPU gloo, under cddprun; rank 2
crashes as step N begins (--fault crash@step=N,rank=2). Two ways to
recover, measured from the crash (cddp-train's T6101 line) to the first
step the recovered group completes (the first T0002 line after it):

  worker  --restart_scope=worker, no --checkpoint: rank 2 alone is started
          again and the others re-form in place and hand it their state
          (docs/distributed.md, "Recovering in place"); 1 step recomputed
          (the one that failed); the time is split into the replacement's
          start-up (process start to its T6211 "joined") and the rest
  group   --restart_scope=group (torchrun's) with --checkpoint
          --ckpt-every K: every rank is stopped, started again and reads
          the checkpoint; up to K steps recomputed

Both runs must end on the same state checksum (T6202); the bench says so.
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


def run(build, args, extra, env):
    cmd = [str(build / "launcher" / "cddprun"), "--nproc_per_node=4", "--max_restarts=1",
           f"--master_port={free_port()}", *extra,
           str(build / "trainer" / "cddp-train"), *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"bench_inplace: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-4000:]}")
    return r.stderr


def measure(err, crash_step, group):
    """(crash time, the recovered group's first step's end, checksums): in
    place, the first end of the step that failed (T0002 counts steps done);
    a group restart, the first step's end of the new attempt's processes."""
    crash = lines(err, rf"T6101: fault injection: crash at step {crash_step}")[0][0]
    steps = lines(err, r"T0002: step (\d+) loss")
    if group:
        restart = lines(err, r"A0207: .*\(attempt 1,")[0][0]
        first = min(t for t, m in steps if t > restart)
    else:
        first = min(t for t, m in steps if int(m.group(1)) == crash_step + 1)
    sums = {m.group(1) for _, m in lines(err, r"T6202: after \d+ steps: state checksum (\w+)")}
    return crash, first, sums


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--crash-step", type=int, default=5)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--image-size", type=int, default=32)
    o = ap.parse_args()
    build = pathlib.Path(o.build)
    env = dict(os.environ, LOGLEVEL="DEBUG")
    steps = o.crash_step + 3
    base = ["--arch", "resnet18", "--data", "synthetic", "--image-size", str(o.image_size),
            "--num-classes", "10", "--num-samples", str(16 * steps), "--batch-size", "4",
            "--epochs", "1", "--fault", f"crash@step={o.crash_step},rank=2"]
    rows = {"worker": [], "group": []}
    for trial in range(o.trials):
        with tempfile.TemporaryDirectory() as tmp:
            err_w = run(build, base, ["--restart_scope=worker"], env)
            ckpt = os.path.join(tmp, "ck.safetensors")
            err_g = run(build, base + ["--checkpoint", ckpt, "--ckpt-every", str(o.ckpt_every)],
                        ["--restart_scope=group"], env)
        cw, fw, sw = measure(err_w, o.crash_step, False)
        cg, fg, sg = measure(err_g, o.crash_step, True)
        started = lines(err_w, r"A0220: .*restarting local_rank")[0][0]
        joined = lines(err_w, r"T6211: rank 2 replaced in generation 1: joined the group in "
                              r"([\d.]+) s")
        spawn_to_join = joined[0][0] - started if joined else float("nan")
        reform = [float(m.group(1)) for _, m in lines(err_w, r"T6211: rank \d re-formed generation"
                                                             r" 1 in ([\d.]+) s")]
        last_ckpt = (o.crash_step // o.ckpt_every) * o.ckpt_every
        rows["worker"].append((fw - cw, spawn_to_join, max(reform) if reform else float("nan")))
        rows["group"].append((fg - cg, o.crash_step - last_ckpt + 1))
        same = sw == sg and len(sw) == 1
        print(f"trial {trial}: worker {fw - cw:.3f} s (replacement start-up to joined "
              f"{spawn_to_join:.3f} s; survivors waited {max(reform):.3f} s in re-forming), "
              f"group+checkpoint {fg - cg:.3f} s; checksums {'equal' if same else 'DIFFER'} "
              f"({', '.join(sorted(sw | sg))})")
    mw = statistics.median(r[0] for r in rows["worker"])
    mg = statistics.median(r[0] for r in rows["group"])
    print(f"\nResNet-18, synthetic {o.image_size}x{o.image_size}, 4 ranks, CPU gloo, crash of "
          f"rank 2 at step {o.crash_step}, median of {o.trials}:")
    print("| recovery | failure to the recovered group's first step | steps recomputed |")
    print("|---|---|---|")
    print(f"| --restart_scope=worker (no checkpoint) | {mw:.3f} s | 1 |")
    print(f"| --restart_scope=group --checkpoint --ckpt-every {o.ckpt_every} | {mg:.3f} s | "
          f"{rows['group'][0][1]} |")
    print(f"ratio group/worker: {mg / mw:.2f}x  ({datetime.date.today()})")


if __name__ == "__main__":
    main()
