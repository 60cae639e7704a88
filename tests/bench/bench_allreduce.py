#!/usr/bin/python3
"""Allreduce bus bandwidth: cddp's gloo path (cddp-collbench --bench) against
torch.distributed's gloo (allreduce_torch.py), side by side on loopback.

For each world size, the two run alternately (--repeat times each, ours
first, then torch, then ours...), same sizes (1 MiB..256 MiB), same
iterations and timing (slowest rank, f32 sum in place). The best of the
repeats per size is kept for each, and the table gives the ratio
ours / torch. A benchmark: it prints figures, it never passes or fails.

    /usr/bin/python3 tests/bench/bench_allreduce.py [--worlds 2,4] [--repeat 2]
        [--max-bytes N] [--build build]

Debian's python3 (python3-torch) is needed for the torch side.
"""
import argparse
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd, world, timeout):
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise SystemExit(f"bench: {cmd[0]} did not finish within {timeout}s")
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise SystemExit(f"bench: {' '.join(cmd)} failed ({p.returncode}):\n{err}")
        outs.append(out)
    return [json.loads(l) for l in outs[0].splitlines() if l.startswith("{")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--build", default=os.environ.get("CDDP_BUILD_DIR", str(ROOT / "build")))
    ap.add_argument("--timeout", type=int, default=900)
    a = ap.parse_args()
    ours_cmd = [str(pathlib.Path(a.build) / "trainer" / "cddp-collbench"), "--bench", "--json",
                f"--min-bytes={a.min_bytes}", f"--max-bytes={a.max_bytes}"]
    torch_cmd = ["/usr/bin/python3", str(ROOT / "tests" / "bench" / "allreduce_torch.py"),
                 f"--min-bytes={a.min_bytes}", f"--max-bytes={a.max_bytes}"]
    print(f"# allreduce bus bandwidth, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    print(f"# command: /usr/bin/python3 tests/bench/bench_allreduce.py --worlds {a.worlds} "
          f"--repeat {a.repeat}")
    for world in (int(w) for w in a.worlds.split(",")):
        best = {"cddp": {}, "torch": {}}
        for _ in range(a.repeat):
            for impl, cmd in (("cddp", ours_cmd), ("torch", torch_cmd)):
                for row in launch(cmd, world, a.timeout):
                    b = best[impl]
                    if row["bytes"] not in b or row["busbw_gbps"] > b[row["bytes"]]["busbw_gbps"]:
                        b[row["bytes"]] = row
        print(f"\nworld size {world} (best of {a.repeat}; busbw = algbw * 2(n-1)/n)\n")
        print("| size | cddp busbw GB/s | torch gloo busbw GB/s | cddp / torch |")
        print("|---:|---:|---:|---:|")
        for size in sorted(best["cddp"]):
            o, t = best["cddp"][size]["busbw_gbps"], best["torch"].get(size, {}).get("busbw_gbps")
            ratio = f"{o / t:.2f}x" if t else "n/a"
            print(f"| {size >> 20} MiB | {o:.3f} | {t:.3f} | {ratio} |" if t else
                  f"| {size >> 20} MiB | {o:.3f} | n/a | n/a |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
