"""Training throughput of cddp-train against PyTorch on the CPU, side by side.

    /usr/bin/python3 tests/bench/bench_trainer.py [--rounds 3] [--rows all|quick]
        [--build build]

For each row (architecture, input size, batch, threads) it runs cddp-train
(--data synthetic) and tests/bench/torch_train.py (Debian's PyTorch) one
after the other, `rounds` times, alternating, so both see the same machine
load. Each run takes `warmup` steps (not counted: oneDNN builds its kernels,
memory is first touched) and then `steps` timed steps. Per row it prints the
median step time of each side over all timed steps of all rounds, the
throughput (img/s) from it, the ratio ours/PyTorch, and each side's peak RSS
(the largest over its runs). A benchmark: it prints figures, it never fails
on them.
"""
import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TORCH_PY = "/usr/bin/python3"

# (arch, image size, batch, threads, timed steps, warm-up steps): the rows
ROWS = {
    "resnet18-64": ("resnet18", 64, 32, 2, 8, 2),
    "resnet50-64": ("resnet50", 64, 32, 2, 6, 2),
    "resnet152-224": ("resnet152", 224, 8, 2, 3, 1),
}


def run(cmd, env):
    """Runs cmd; returns (step times, peak RSS in KiB) from its output and rusage."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)
    out = proc.stdout
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({proc.returncode}):\n{out}")
    times = [float(m.group(1)) for m in re.finditer(r"step \d+ (?:loss \S+ )?time ([0-9.]+)", out)]
    rss = [int(m.group(1)) for m in re.finditer(r"peak_rss_kb (\d+)", out)]
    return times, (rss[0] if rss else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", default="all", help="all, or a comma-separated list of " +
                    ", ".join(ROWS))
    ap.add_argument("--threads", type=int, help="override every row's thread count")
    a = ap.parse_args()
    train = pathlib.Path(a.build) / "trainer" / "cddp-train"
    rows = list(ROWS) if a.rows == "all" else a.rows.split(",")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {os.uname().nodename}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'row':16} {'ours img/s':>10} {'torch img/s':>11} {'ratio':>6} "
          f"{'ours RSS MiB':>12} {'torch RSS MiB':>13}")
    for name in rows:
        arch, size, batch, threads, steps, warm = ROWS[name]
        threads = a.threads or threads
        total = steps + warm
        env = dict(os.environ, LOGLEVEL="DEBUG", OMP_NUM_THREADS=str(threads))
        ours_cmd = [str(train), "--arch", arch, "--data", "synthetic", "--image-size", str(size),
                    "--batch-size", str(batch), "--threads", str(threads),
                    "--num-samples", str(batch * total), "--epochs", "1", "--steps", str(total)]
        torch_cmd = [TORCH_PY, str(ROOT / "tests/bench/torch_train.py"), "--arch", arch,
                     "--image-size", str(size), "--batch-size", str(batch),
                     "--threads", str(threads), "--steps", str(total)]
        ours_t, torch_t, ours_rss, torch_rss = [], [], [], []
        for _ in range(a.rounds):
            t, r = run(ours_cmd, env)
            ours_t += t[warm:]
            ours_rss.append(r or 0)
            t, r = run(torch_cmd, env)
            torch_t += t[warm:]
            torch_rss.append(r or 0)
        ours = batch / statistics.median(ours_t)
        theirs = batch / statistics.median(torch_t)
        print(f"{name:16} {ours:10.1f} {theirs:11.1f} {ours / theirs:6.2f} "
              f"{max(ours_rss) / 1024:12.0f} {max(torch_rss) / 1024:13.0f}", flush=True)


if __name__ == "__main__":
    main()
