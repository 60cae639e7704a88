#!/usr/bin/env python3
"""Training throughput of cddp-train beside PyTorch eager (tools/gpu-check's throughput stage).

The issue's benchmark: ResNet-152, batch 64, 224x224, SGD (lr 0.01, momentum
0.9, weight decay 1e-4), per mode:

  bf16  ours: --amp bf16;  torch: channels_last, autocast(bfloat16)
  fp32  ours: --amp off (TF32 in convolutions, PyTorch's default);
        torch: channels_last, no autocast, its default TF32 flags

The first mode is also run with --cuda-graphs (ours: the step captured
after its warm-up and replayed; the default 5 warm-up steps cover the
capture), reported as cddp_graphs beside cddp; --no-graphs leaves it out,
and --device cpu (which refuses --cuda-graphs) never runs it.

img/s over --steps steps after --warmup steps, and the peak device memory
(ours: T2002; torch: torch.cuda.max_memory_allocated). Ours is end to end:
each step's time (T0002) includes making the synthetic batch on the CPU and
copying it over; torch's reuses one batch already on the GPU (the eager
baseline at its best). Beside ours, the time its step loop waited for input
batches (T2600, per step after the first, at the default --prefetch): the
"GPU never waits" figure of issue 11, ~0 when the loader thread keeps up. --device cpu runs the same code on the CPU with
small settings (the integration test does, so this script is exercised
without a GPU); figures from it mean nothing.

    throughput.py --train build/trainer/cddp-train --json out.json

--budget bounds all the runs together: each run gets --timeout or what is
left, and one that would start with less than 20 s left is recorded as
skipped ("budget"); --json is rewritten after every run, so a stage cut
short still has the runs that ended (bf16 first: ours, torch's, ours with
--cuda-graphs; then fp32).

Exit 0 when every run finished, 1 when one failed or ran past --timeout, 2
on bad arguments.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gpu_common  # noqa: E402


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True, help="the cddp-train binary")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--arch", default="resnet152")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--modes", default="bf16,fp32", help="comma-separated: bf16, fp32")
    p.add_argument("--timeout", type=float, default=150, help="bound on each run (s)")
    p.add_argument("--budget", type=float, default=0, help="bound on all runs (s); 0: none")
    p.add_argument("--no-graphs", action="store_true", help="no --cuda-graphs run")
    p.add_argument("--json", help="write the result here")
    a = p.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.modes if m not in ("bf16", "fp32")]
    if bad or not a.modes:
        p.error(f"--modes: {','.join(bad) or '(none)'}: each must be bf16 or fp32")
    if a.batch < 2 or a.warmup < 0 or a.steps < 1:
        p.error("--batch >= 2, --warmup >= 0, --steps >= 1")
    return a


STEP = re.compile(r"T0002: step (\d+) loss \S+ time (\S+) s")
PEAK = re.compile(r"T2002: peak device memory (\S+) MiB")
RSS = re.compile(r"T0004: peak_rss_kb (\d+)")
WAIT = re.compile(r"T2600: input: (\S+) s waiting for batches in \d+ steps, (\S+) s of it in the "
                  r"first, (\S+) ms/step after it \(--prefetch (\d+)\)")


_end = []


def run_timeout(a):
    """This run's bound: --timeout, or what --budget leaves; None: no time."""
    if not _end:
        return a.timeout
    left = _end[0] - time.monotonic()
    return min(a.timeout, left) if left >= 20 else None


def save(a, result):
    """The result so far into --json (a temporary file renamed)."""
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


def ours(a, mode, graphs=False):
    timeout = run_timeout(a)
    if timeout is None:
        return {"error": "skipped: the stage's budget ran out", "skipped": True}
    total = a.warmup + a.steps
    cmd = [a.train, "--device", a.device, "--arch", a.arch, "--data", "synthetic",
           "--batch-size", str(a.batch), "--image-size", str(a.image_size),
           "--num-samples", str(a.batch * total), "--steps", str(total), "--epochs", "1",
           "--log-every", "1000000", "--num-classes", "1000"]
    if mode == "bf16":
        cmd += ["--amp", "bf16"]
    if graphs:
        cmd += ["--cuda-graphs"]
    env = dict(os.environ, LOGLEVEL="DEBUG")
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout:.0f} s"}
    out = {"seconds": round(time.time() - t0, 1), "command": " ".join(cmd[1:])}
    if r.returncode != 0:
        out["error"] = f"exit {r.returncode}: {r.stderr[-1500:]}"
        return out
    times = [float(m.group(2)) for m in STEP.finditer(r.stderr)]
    if len(times) != total:
        out["error"] = f"{len(times)} step times in the log, expected {total}"
        return out
    timed = sum(times[a.warmup:])
    out["img_per_s"] = round(a.batch * a.steps / timed, 1)
    out["first_step_s"] = round(times[0], 3)
    m = PEAK.search(r.stderr)
    if m:
        out["peak_mib"] = float(m.group(1))
    m = RSS.search(r.stderr)
    if m:
        out["peak_rss_mib"] = round(int(m.group(1)) / 1024, 1)
    m = WAIT.search(r.stderr)
    if m:
        out["input_wait_s"] = float(m.group(1))
        out["input_wait_first_step_s"] = float(m.group(2))
        out["input_wait_ms_per_step"] = float(m.group(3))  # after the first step
        out["prefetch"] = int(m.group(4))
    notes = [l.split(": ", 1)[-1] for l in r.stderr.splitlines() if "T2400" in l]
    if notes:
        out["note"] = notes[0]
    return out


def torch_eager(a, mode):
    import torch
    import torchvision

    dev = torch.device(a.device)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.arch)(num_classes=1000).to(dev)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    crit = torch.nn.CrossEntropyLoss()
    x = torch.randn(a.batch, 3, a.image_size, a.image_size, device=dev)
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,), device=dev)
    cuda = a.device == "cuda"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = crit(model(x), y)
        loss.backward()
        opt.step()

    t0 = time.time()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(a.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    t1 = time.time()
    for _ in range(a.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    t2 = time.time()
    out = {"img_per_s": round(a.batch * a.steps / (t2 - t1), 1), "seconds": round(t2 - t0, 1)}
    if cuda:
        out["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    del model, opt, x, y
    if cuda:
        torch.cuda.empty_cache()
    return out


def main(argv):
    a = parse(argv)
    if a.budget > 0:
        _end.append(time.monotonic() + a.budget)
    result = {"arch": a.arch, "batch": a.batch, "image_size": a.image_size, "device": a.device,
              "warmup": a.warmup, "steps": a.steps, "modes": {}}
    rc = 0
    for mode in a.modes:
        o = ours(a, mode)
        entry = {"cddp": o}
        result["modes"][mode] = entry
        save(a, result)
        if run_timeout(a) is None:
            t = {"error": "skipped: the stage's budget ran out", "skipped": True}
        else:
            try:
                t = torch_eager(a, mode)
            except Exception as e:  # an out-of-memory or a missing torchvision: recorded
                t = {"error": f"{type(e).__name__}: {e}"}
        entry["torch_eager"] = t
        save(a, result)
        if "img_per_s" in o and "img_per_s" in t:
            entry["speedup"] = round(o["img_per_s"] / t["img_per_s"], 3)
        if ("error" in o and not o.get("skipped")) or ("error" in t and not t.get("skipped")):
            rc = 1
        if mode == a.modes[0] and not a.no_graphs and a.device == "cuda":
            g = ours(a, mode, graphs=True)
            entry["cddp_graphs"] = g
            if "img_per_s" in g and "img_per_s" in t:
                entry["speedup_graphs"] = round(g["img_per_s"] / t["img_per_s"], 3)
            if "error" in g and not g.get("skipped"):
                rc = 1
            print(f"throughput {a.arch} batch {a.batch} {mode} --cuda-graphs: cddp "
                  f"{g.get('img_per_s', g.get('error'))} img/s (peak {g.get('peak_mib', '?')} MiB)",
                  flush=True)
        save(a, result)
        print(f"throughput {a.arch} batch {a.batch} {mode}: cddp "
              f"{o.get('img_per_s', o.get('error'))} img/s (peak {o.get('peak_mib', '?')} MiB, "
              f"waited for input {o.get('input_wait_ms_per_step', '?')} ms/step), "
              f"torch eager {t.get('img_per_s', t.get('error'))} img/s "
              f"(peak {t.get('peak_mib', '?')} MiB)", flush=True)
    result["complete"] = True
    save(a, result)
    return rc


if __name__ == "__main__":
    gpu_common.run_main(main)
