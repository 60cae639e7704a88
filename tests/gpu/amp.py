#!/usr/bin/env python3
"""AMP learns: cddp-train --amp bf16 and --amp fp16 on a small learnable set (tools/gpu-check's amp stage).

ResNet-18 on 256 IDX images of 32x32 (10 classes, each a bright square in
its own place of the image over noise: learnable in a few epochs), batch
32, 5 epochs (40 SGD steps, lr 0.05, momentum 0.9), once per mode. Each run
must:

  - exit 0, with every step's loss finite;
  - learn: the mean loss of the last 4 steps below --drop (0.5) times the
    mean of the first 4;
  - under --amp: say so (T2400, the precision line), so the run really had
    bf16/fp16 activations;
  - fp16 (GradScaler): skip no step after step --skip-grace (12): a few
    skips at the start while the scale (65536) backs off are GradScaler's
    normal behaviour, later ones mean the fp16 path overflows; bf16: skip
    none (no loss scaling).

On cuda this takes some 10 s a mode (mostly cuDNN's algorithm search).
With --device cpu --modes off it is the same script on the CPU (the
gpu-check self-test runs it that way, small: --samples 128 --epochs 3),
so its own code is exercised without a GPU.

    amp.py --train build/trainer/cddp-train --json out.json

Exit 0 when every run holds, 1 when one does not (the JSON says which), 2
on bad arguments, 77 (skipped, one line) without numpy or, on cuda, when
cddp-train sees no CUDA device (meson's suite gpu runs it:
tests/gpu/meson.build).
"""
import argparse
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path[:0] = [str(HERE), str(TESTS), str(TESTS / "compat")]

import gpu_common  # noqa: E402

SIZE, CLASSES = 32, 10
SKIP = re.compile(r"T2004: step (\d+):")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True, help="the cddp-train binary")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--modes", default="bf16,fp16", help="comma-separated: bf16, fp16, off")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--drop", type=float, default=0.5, help="last/first loss ratio to stay below")
    p.add_argument("--skip-grace", type=int, default=12, help="fp16: skipped steps allowed up to")
    p.add_argument("--timeout", type=float, default=60, help="bound on each run (s)")
    p.add_argument("--json", help="write the result here")
    a = p.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.modes if m not in ("bf16", "fp16", "off")]
    if bad or not a.modes:
        p.error(f"--modes: {','.join(bad) or '(none)'}: each must be bf16, fp16 or off")
    if a.device == "cpu" and any(m != "off" for m in a.modes):
        p.error("--device cpu: --modes off only (cddp-train refuses --amp on the CPU)")
    if a.batch < 2 or a.samples < a.batch or a.epochs < 1 or steps_of(a) < 8:
        p.error("--batch >= 2, --samples >= --batch, --epochs >= 1, 8 steps at least")
    return a


def steps_of(a):
    return a.epochs * -(-a.samples // a.batch)


def make_data(np, directory, n):
    """n images: noise, and a bright 8x8 square whose place (a 4 x 3 grid) is the class."""
    rng = np.random.default_rng(11)
    y = (np.arange(n) % CLASSES).astype(np.uint8)
    rng.shuffle(y)
    x = rng.integers(0, 96, (n, SIZE, SIZE), dtype=np.uint8)
    for i, k in enumerate(y):
        r, c = 2 + 10 * (int(k) // 4), 1 + 8 * (int(k) % 4)
        x[i, r:r + 8, c:c + 7] = 255
    return x, y


def run_mode(a, ref, data, mode):
    cmd = [a.train, "--arch", "resnet18", "--data", f"idx:{data}", "--batch-size", str(a.batch),
           "--epochs", str(a.epochs), "--lr", "0.05", "--momentum", "0.9", "--weight-decay",
           "1e-4", "--device", a.device, "--amp", mode, "--log-every", "1000000"]
    if a.device == "cpu":
        cmd += ["--threads", "2"]
    env = dict(os.environ, LOGLEVEL="DEBUG")
    out = {"mode": mode, "ok": False}
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    except subprocess.TimeoutExpired:
        out["error"] = f"ran past {a.timeout} s"
        return out
    out["seconds"] = round(time.time() - t0, 1)
    if r.returncode == 2 and "no CUDA device is visible" in r.stderr:
        out["skipped"] = "no CUDA device is visible"
        return out
    if r.returncode != 0:
        out["error"] = f"cddp-train exited {r.returncode}: {r.stderr[-1500:]}"
        return out
    losses = ref.losses_of(r.stderr)
    skipped = [int(m.group(1)) for m in SKIP.finditer(r.stderr)]
    steps = steps_of(a)
    first = sum(losses[:4]) / 4 if len(losses) >= 4 else float("nan")
    last = sum(losses[-4:]) / 4 if len(losses) >= 4 else float("nan")
    out.update(steps=len(losses), first_loss=round(first, 4), last_loss=round(last, 4),
               skipped_steps=skipped, precision_line=any("T2400" in l for l in r.stderr.splitlines()))
    if len(losses) != steps:
        out["error"] = f"{len(losses)} step losses in the log, {steps} expected"
    elif not all(math.isfinite(v) for v in losses):
        out["error"] = "a step's loss is not finite"
    elif not last < a.drop * first:
        out["error"] = f"did not learn: last 4 steps {last:.4f}, first 4 {first:.4f} (x{a.drop})"
    elif mode != "off" and not out["precision_line"]:
        out["error"] = "no T2400 line: the run did not say its activations are " + mode
    elif mode == "fp16" and any(s > a.skip_grace for s in skipped):
        out["error"] = f"fp16 skipped steps {skipped}, some after step {a.skip_grace}"
    elif mode != "fp16" and skipped:
        out["error"] = f"{mode} skipped steps {skipped} (no loss scaling: there should be none)"
    else:
        out["ok"] = True
    return out


def numpy_or_why():
    """(numpy, None), or (None, why it cannot be imported)."""
    try:
        import numpy
    except ImportError as e:
        return None, str(e)
    return numpy, None


def main(argv):
    a = parse(argv)
    t0 = time.time()
    np, why = numpy_or_why()
    if np is None:
        print(f"amp: skipped: {why} in {sys.executable}")
        return 77
    import test_trainer_parity as ref  # write_idx, losses_of

    result = {"device": a.device, "samples": a.samples, "batch": a.batch, "epochs": a.epochs,
              "drop": a.drop, "runs": [], "ok": False}
    with tempfile.TemporaryDirectory(prefix="cddp-amp-") as tmp:
        data = pathlib.Path(tmp) / "data"
        data.mkdir()
        x, y = make_data(np, data, a.samples)
        ref.write_idx(data, "train", x, y)
        ref.write_idx(data, "t10k", x[:a.batch], y[:a.batch])
        for mode in a.modes:
            run = run_mode(a, ref, data, mode)
            if run.get("skipped"):
                print(f"amp: skipped: {run['skipped']}")
                return 77
            result["runs"].append(run)
            print(f"amp {mode} on {a.device}: " + ("ok" if run["ok"] else "FAILED") +
                  (f" (loss {run['first_loss']} -> {run['last_loss']} over {run['steps']} steps, "
                   f"skipped {run['skipped_steps']}, {run['seconds']} s)" if "steps" in run else "") +
                  (f": {run['error']}" if run.get("error") else ""), flush=True)
    result["ok"] = all(r["ok"] for r in result["runs"])
    result["seconds"] = round(time.time() - t0, 1)
    return gpu_common.finish(a.json, result, 0 if result["ok"] else 1)


if __name__ == "__main__":
    gpu_common.run_main(main)
