#!/usr/bin/python3
"""DDP step time of cddp-train at 1, 2 and 4 ranks, with the gradient
allreduces overlapped with backward (the default) and after it
(--no-overlap), side by side.

Each configuration is one `cddprun --nproc_per_node=W cddp-train` run on
synthetic data (same arch, image size and per-rank batch everywhere);
configurations run alternately, --repeat times each, and each row keeps the
repeat with the lowest median. Per run, from rank 0's DEBUG log: the median
step time over the steps after --warmup (T0002), and the time the step then
still waited for its gradient allreduces after backward (T6203: the
communication the overlap did not hide). Threads per rank: the cores
(--cores, default all) divided among the ranks, at least 1.

    /usr/bin/python3 tests/bench/bench_ddp.py [--worlds 1,2,4] [--repeat 2]
        [--arch resnet18] [--image-size 32] [--batch-size 16] [--steps 12]
        [--warmup 3] [--build build] [--json]

A benchmark: it prints figures, it never passes or fails.
"""
import argparse
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def one_run(args, world, overlap):
    build = pathlib.Path(args.build)
    threads = max(1, args.cores // world)
    cmd = [str(build / "launcher" / "cddprun"), f"--nproc_per_node={world}", "--standalone",
           str(build / "trainer" / "cddp-train"), "--arch", args.arch, "--data", "synthetic",
           "--image-size", str(args.image_size), "--num-classes", "100",
           "--num-samples", str(args.batch_size * world * (args.steps + 1)),
           "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--epochs", "1",
           "--threads", str(threads), "--log-every", "1000000"]
    if not overlap:
        cmd.append("--no-overlap")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LOGLEVEL="DEBUG", TMPDIR=tmp)
        t0 = time.monotonic()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    tag = "rank0 "  # cddprun sets RANK, so every line carries its rank
    times = [float(m.group(1)) for m in
             re.finditer(rf"cddp-train\[\d+\] {tag}\S+ DEBUG T0002: step \d+ loss \S+ time (\S+) s",
                         r.stderr)]
    if len(times) != args.steps:
        raise SystemExit(f"bench: expected {args.steps} step times, got {len(times)}:\n"
                         f"{r.stderr[-3000:]}")
    wait_ms = 0.0
    m = re.search(rf"{tag}\S+ INFO T6203: DDP: .*\(([\d.]+) ms/step\) waiting", r.stderr)
    if m:
        wait_ms = float(m.group(1))
    step = statistics.median(times[args.warmup:])
    return {"world": world, "overlap": overlap, "threads_per_rank": threads,
            "step_ms": step * 1e3, "img_per_s": world * args.batch_size / step,
            "exposed_comm_ms": wait_ms, "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.warmup >= args.steps:
        ap.error("--warmup must be below --steps")
    worlds = [int(w) for w in args.worlds.split(",")]

    best = {}
    for _ in range(args.repeat):
        for w in worlds:
            for overlap in (True, False):
                row = one_run(args, w, overlap)
                key = (w, overlap)
                if key not in best or row["step_ms"] < best[key]["step_ms"]:
                    best[key] = row
    if args.json:
        for row in best.values():
            print(json.dumps(row))
        return
    print(f"# {args.arch}, {args.image_size}x{args.image_size}, batch {args.batch_size} per rank, "
          f"{args.steps} steps ({args.warmup} warm-up), best of {args.repeat}; "
          f"{args.cores} cores; {platform.machine()}, {time.strftime('%Y-%m-%d')}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| ranks | threads/rank | overlap | step ms | img/s (all ranks) | "
          "waited after backward ms/step | no-overlap / overlap |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for w in worlds:
        on, off = best[(w, True)], best[(w, False)]
        for row in (on, off):
            ratio = f"{off['step_ms'] / on['step_ms']:.2f}x" if row is off else ""
            print(f"| {w} | {row['threads_per_rank']} | {'on' if row['overlap'] else 'off'} | "
                  f"{row['step_ms']:.1f} | {row['img_per_s']:.1f} | "
                  f"{row['exposed_comm_ms']:.1f} | {ratio} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
