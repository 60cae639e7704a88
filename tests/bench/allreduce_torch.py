"""torch.distributed's gloo allreduce bus bandwidth, measured exactly as
cddp-collbench --bench measures ours (same sizes, iterations, warm-up, f32
sum in place, slowest rank's time). Started like any torch worker: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment. Prints JSON lines
on rank 0. Run by tests/bench/bench_allreduce.py with Debian's python3.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    buf = torch.zeros(a.max_bytes // 4, dtype=torch.float32)
    size = a.min_bytes
    while size <= a.max_bytes:
        t = buf[: size // 4]
        iters = a.iters or min(50, max(3, (512 << 20) // size))
        for _ in range(a.warmup):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.monotonic()
        for _ in range(iters):
            dist.all_reduce(t)
        el = torch.tensor([time.monotonic() - t0], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        per = el.item() / iters
        algbw = size / per / 1e9
        if rank == 0:
            print(json.dumps({"impl": "torch", "world": world, "bytes": size, "iters": iters,
                              "time_us": round(per * 1e6, 1), "algbw_gbps": round(algbw, 4),
                              "busbw_gbps": round(algbw * 2 * (world - 1) / world, 4)}),
                  flush=True)
        size *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
