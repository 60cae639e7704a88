#!/usr/bin/python3
"""The input pipeline (--prefetch, issue 11): CPU ResNet-18 training
throughput with the loader thread off (--prefetch 0) and at its default,
on synthetic data and on a folder of JPEGs, side by side; and the folder
dataset's JPEG decode rate per core at the training size, so the docs can
say how many cores keep a GPU fed.

The JPEG folder is made here: --images photos-like images (smooth
gradients plus noise, --jpeg-size pixels, quality 90, PIL) in 4 classes.
Each configuration is one cddp-train run (--arch, --image-size,
--batch-size, --steps, all cores); configurations run alternately,
--repeat times each, and each row keeps the repeat with the lowest median
step time (T0002, after --warmup steps). "waited" is T2600: the step
loop's time waiting for batches, in the first step (the loader starting)
and per step after it. The decode rate is
tests/bench/jpeg_rate.c (decode, resize, crop, normalise on 1 thread, then
on all cores); the same tool gives the synthetic dataset's rate (its
Box-Muller pixels).

    /usr/bin/python3 tests/bench/bench_prefetch.py [--repeat 2] [--steps 8]
        [--warmup 2] [--image-size 224] [--batch-size 16] [--images 96]
        [--prefetch 0,default] [--data synthetic,folder] [--target 2850]
        [--build build] [--json]

A benchmark: it prints figures, it never passes or fails.
"""
import argparse
import json
import math
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


def make_folder(root, n, size):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(11)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    for i in range(n):
        c = i % 4
        os.makedirs(root / f"class{c}", exist_ok=True)
        base = np.stack([(xx * (1 + i % 3)) % 256, (yy * (2 + c)) % 256,
                         ((xx + yy) * 127 / (w + h)) + 40 * c], -1)
        a = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(a, "RGB").save(root / f"class{c}" / f"{i:04d}.jpg", "JPEG", quality=90)


def one_run(args, data, prefetch):
    cmd = [str(pathlib.Path(args.build) / "trainer" / "cddp-train"), "--arch", args.arch,
           "--data", data, "--image-size", str(args.image_size), "--num-classes", "100",
           "--num-samples", str(args.batch_size * (args.steps + 1)),
           "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--epochs", "1000",
           "--threads", str(args.cores), "--log-every", "1000000"]
    if prefetch is not None:
        cmd += ["--prefetch", str(prefetch)]
    env = dict(os.environ, LOGLEVEL="DEBUG")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        sys.exit(f"bench_prefetch: {' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}")
    times = [float(t) for t in re.findall(r"T0002: step \d+ loss \S+ time ([\d.]+) s", r.stderr)]
    m = re.search(r"T2600: input: ([\d.]+) s waiting for batches in \d+ steps, ([\d.]+) s of it "
                  r"in the first, ([\d.]+) ms/step after it \(--prefetch (\d+)\)", r.stderr)
    step = statistics.median(times[args.warmup:])
    return {"data": data.split(":")[0], "prefetch": int(m.group(4)), "step_ms": step * 1e3,
            "img_per_s": args.batch_size / step, "first_wait_ms": float(m.group(2)) * 1e3,
            "waited_ms_per_step": float(m.group(3))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--jpeg-size", default="500x375")
    ap.add_argument("--target", type=float, default=2850.0, help="img/s to keep fed")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--prefetch", default="0,default", help="values to compare")
    ap.add_argument("--data", default="synthetic,folder")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    values = [None if v == "default" else int(v) for v in args.prefetch.split(",")]
    if args.warmup >= args.steps:
        ap.error("--warmup must be below --steps")
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp) / "jpegs"
        make_folder(folder, args.images, tuple(int(v) for v in args.jpeg_size.split("x")))
        kb = sum(p.stat().st_size for p in folder.rglob("*.jpg")) / args.images / 1024
        dec = subprocess.run([str(pathlib.Path(args.build) / "tests" / "bench" / "jpeg_rate"),
                              f"folder:{folder}", str(args.image_size), str(args.cores), "4"],
                             capture_output=True, text=True, timeout=args.timeout, check=True)
        decode = json.loads(dec.stdout)
        syn = subprocess.run([str(pathlib.Path(args.build) / "tests" / "bench" / "jpeg_rate"),
                              "synthetic", str(args.image_size), str(args.cores), "4"],
                             capture_output=True, text=True, timeout=args.timeout, check=True)
        synthetic = json.loads(syn.stdout)
        best = {}
        for _ in range(args.repeat):
            for data in args.data.split(","):
                if data == "folder":
                    data = f"folder:{folder}"
                for prefetch in values:
                    row = one_run(args, data, prefetch)
                    key = (row["data"], row["prefetch"])
                    if key not in best or row["step_ms"] < best[key]["step_ms"]:
                        best[key] = row
    if args.json:
        for row in best.values():
            print(json.dumps(row))
        print(json.dumps(dict(decode, data="folder")))
        print(json.dumps(dict(synthetic, data="synthetic")))
        return
    print(f"# {args.arch}, {args.image_size}x{args.image_size}, batch {args.batch_size}, "
          f"{args.steps} steps ({args.warmup} warm-up), best of {args.repeat}; {args.cores} "
          f"cores; {platform.machine()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| data | --prefetch | step ms | img/s | waited in step 1 ms | waited after, ms/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for (data, prefetch), row in sorted(best.items()):
        print(f"| {data} | {prefetch} | {row['step_ms']:.0f} | {row['img_per_s']:.2f} | "
              f"{row['first_wait_ms']:.0f} | {row['waited_ms_per_step']:.1f} |")
    per_core = decode["per_core_img_per_s"]
    print(f"\nJPEG decode ({args.images} images of {args.jpeg_size}, {kb:.0f} KiB each, "
          f"to {args.image_size}x{args.image_size}): {per_core:.0f} img/s on 1 core, "
          f"{decode['img_per_s']:.0f} img/s on {decode['threads']} threads; "
          f"{args.target:.0f} img/s needs {math.ceil(args.target / per_core)} such cores")
    per_core = synthetic["per_core_img_per_s"]
    print(f"synthetic ({args.image_size}x{args.image_size}): {per_core:.0f} img/s on 1 core, "
          f"{synthetic['img_per_s']:.0f} img/s on {synthetic['threads']} threads; "
          f"{args.target:.0f} img/s needs {math.ceil(args.target / per_core)} such cores")


if __name__ == "__main__":
    main()
