#!/usr/bin/env python3
"""cddp-train with and without --cuda-graphs: the same losses (tools/gpu-check's graphs stage).

Pairs of short ResNet-18 runs on synthetic data, --deterministic --tf32 off,
each pair once as usual and once with --cuda-graphs: the loss of every step
(the T0002 debug lines) must agree within --rtol, and the graph run must
have captured its graphs and replayed them (T2503: captures >= 2, replays
in most steps). The data leaves a short last batch, so each epoch's
uncaptured last step and the replays after it are in the comparison; two
epochs cross an epoch's end. The pairs:

  plain      one micro-batch per step: the forward-and-backward graph and
             the SGD graph
  accum-fp16 --accum-steps 2 --amp fp16: both micro-batch graphs (the second
             accumulates) and the unscale + SGD graph with GradScaler's
             device-side found_inf

Why a tolerance, not equal bits: each process chooses its cuDNN algorithms
by measuring them (deterministic ones only here), so two processes may sum
in different orders; a graph that replays stale inputs, a stale learning
rate or loss scale, or skips an update, moves the losses by far more
within a few steps.

--device cpu (the self-test): --cuda-graphs must be refused (exit 2, one
line naming the flag), and the comparison runs on two plain CPU runs, so
this script's own code runs without a GPU.

    graphs.py --train build/trainer/cddp-train --json out.json

Exit 0 when every pair agrees, 1 when one does not or a run failed, 2 on bad
arguments, 77 (one line) with --device cuda and no GPU visible.
"""
import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gpu_common  # noqa: E402

STEP = re.compile(r"T0002: step (\d+) loss (\S+) time \S+ s")
SUMMARY = re.compile(r"T2503: CUDA graphs: (\d+) captured, (\d+) replays, (\d+) launches run "
                     r"uncaptured, (\d+) invalidations")
PAIRS = {"plain": [], "accum-fp16": ["--accum-steps", "2", "--amp", "fp16"]}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True, help="the cddp-train binary")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=6, help="full batches per epoch (then a short one)")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--timeout", type=float, default=60, help="bound on each run (s)")
    p.add_argument("--json", help="write the result here")
    a = p.parse_args(argv)
    if a.batch < 4 or a.batches < 1 or a.rtol <= 0:
        p.error("--batch >= 4, --batches >= 1, --rtol > 0")
    return a


def train(a, extra, device):
    # a short last batch of 3 images (batch norm needs more than one value)
    cmd = [a.train, "--device", device, "--arch", "resnet18", "--data", "synthetic",
           "--batch-size", str(a.batch), "--image-size", str(a.image_size),
           "--num-samples", str(a.batch * a.batches + 3), "--epochs", "2", "--num-classes", "10",
           "--lr", "0.05", "--log-every", "1000000", "--tf32", "off", "--deterministic",
           "--seed", "3"] + extra
    if device == "cpu":
        cmd += ["--threads", "2"]
    env = dict(os.environ, LOGLEVEL="DEBUG")
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {a.timeout} s", "command": " ".join(cmd[1:])}
    out = {"rc": r.returncode, "seconds": round(time.time() - t0, 1),
           "command": " ".join(cmd[1:]), "stderr": r.stderr}
    out["losses"] = [float(m.group(2)) for m in STEP.finditer(r.stderr)]
    m = SUMMARY.search(r.stderr)
    if m:
        out["graphs"] = dict(zip(("captured", "replays", "uncaptured", "invalidations"),
                                 map(int, m.groups())))
    return out


def compare(a, name, extra):
    """One pair: plain, then (on cuda) --cuda-graphs; the check's entry."""
    graphs = a.device == "cuda"
    base = train(a, extra, a.device)
    other = train(a, extra + (["--cuda-graphs"] if graphs else []), a.device)
    entry = {"pair": name, "flags": " ".join(extra), "graphs": graphs}
    for key, run in (("without", base), ("with", other)):
        if run.get("error") or run["rc"] != 0:
            entry["status"] = "failed"
            entry["error"] = f"{key} --cuda-graphs: " + (run.get("error") or
                                                         f"exit {run['rc']}: {run['stderr'][-1500:]}")
            return entry
    la, lb = base["losses"], other["losses"]
    entry["steps"] = len(la)
    entry["losses"] = {"without": la, "with": lb}
    if not la or len(la) != len(lb):
        entry["status"] = "failed"
        entry["error"] = f"{len(la)} and {len(lb)} step losses in the logs"
        return entry
    worst = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(la, lb))
    entry["max_rel_diff"] = worst
    entry["status"] = "ok" if worst <= a.rtol else "failed"
    if worst > a.rtol:
        entry["error"] = f"losses differ by {worst:.3g} relative (tolerance {a.rtol:g})"
    if graphs:
        g = other.get("graphs")
        entry["graph_counts"] = g
        # every micro-batch graph and the optimizer's, replayed in most steps
        want = 3 if "--accum-steps" in extra else 2
        if not g or g["captured"] < want or g["replays"] < len(la) // 2:
            entry["status"] = "failed"
            entry["error"] = f"expected >= {want} graphs captured and >= {len(la) // 2} replays: {g}"
    return entry


def refusal(a):
    """--cuda-graphs on the CPU: exit 2, one line naming the flag."""
    r = subprocess.run([a.train, "--device", "cpu", "--cuda-graphs"], capture_output=True,
                       text=True, timeout=60)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    ok = r.returncode == 2 and len(lines) == 1 and "--cuda-graphs:" in lines[0]
    return {"pair": "cpu-refusal", "status": "ok" if ok else "failed", "rc": r.returncode,
            "stderr": r.stderr[-500:]}


def main(argv):
    a = parse(argv)
    if a.device == "cuda" and not (shutil.which("nvidia-smi") and
                                   any(pathlib.Path("/dev").glob("nvidia[0-9]*"))):
        print("graphs.py: skipped: no NVIDIA GPU visible")
        return 77
    checks = []
    if a.device == "cpu":
        checks.append(refusal(a))
    for name, extra in PAIRS.items():
        if a.device == "cpu" and "--amp" in extra:
            extra = [x for x in extra if x not in ("--amp", "fp16")]  # the CPU has no AMP
        checks.append(compare(a, name, extra))
    for c in checks:
        print(f"graphs {c['pair']}: {c['status']}"
              + (f", {c['steps']} steps, max rel. diff {c['max_rel_diff']:.3g}"
                 if "max_rel_diff" in c else "")
              + (f", graphs {c['graph_counts']}" if c.get("graph_counts") else "")
              + (f": {c['error']}" if c.get("error") else ""), flush=True)
    rc = 0 if all(c["status"] == "ok" for c in checks) else 1
    return gpu_common.finish(a.json, {"device": a.device, "checks": checks,
                                      "ok": rc == 0}, rc)


if __name__ == "__main__":
    gpu_common.run_main(main)
