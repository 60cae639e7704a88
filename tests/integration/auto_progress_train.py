"""A seed-style PyTorch training script with no progress code of its own,
for tests/integration/test_auto_progress.py: a small model, SGD, an
optional DDP over gloo (init_method='env://'), and the faults the tests
need. cddprun's automatic progress is the only thing that reports its
steps (unless --own-progress).

    --out DIR          each rank writes DIR/rank<R>.json at the end: its
                       PYTHONPATH, which sitecustomize it sees, the steps done
    --steps N          optimizer steps (with --until: at least these)
    --until FILE       go on stepping until FILE exists
    --ddp              DistributedDataParallel over gloo
    --hang-rank R      rank R stops (sleeps) as step --hang-step begins, in
    --hang-step N      the first attempt only (TORCHELASTIC_RESTART_COUNT 0)
    --slow-rank R      rank R sleeps --slow-s seconds more each step
    --step-s S         every rank sleeps S seconds each step
    --own-progress     writes its own progress lines (step 1000 + i, a loss)
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--until")
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-step", type=int, default=10)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-s", type=float, default=0.2)
    ap.add_argument("--step-s", type=float, default=0.0)
    ap.add_argument("--own-progress", action="store_true")
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    if args.ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group(backend="gloo", init_method="env://")
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(32, 16)
    y = (x[:, 0] > 0).long()
    fd = int(os.environ.get("CDDP_PROGRESS_FD", "-1")) if args.own_progress else -1

    step = 0
    while step < args.steps or (args.until and not os.path.exists(args.until)):
        if rank == args.hang_rank and step == args.hang_step and attempt == 0:
            time.sleep(3600)
        if rank == args.slow_rank:
            time.sleep(args.slow_s)
        if args.step_s:
            time.sleep(args.step_s)
        if fd >= 0 and step == 0:
            os.write(fd, b'{"step":1000}\n')  # before the first optimizer step
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        step += 1
        if fd >= 0:
            line = {"step": 1000 + step, "loss": round(loss.item(), 6)}
            os.write(fd, (json.dumps(line) + "\n").encode())

    import sitecustomize

    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump({"pythonpath": os.environ.get("PYTHONPATH"),
                   "sys_path": sys.path,
                   "sitecustomize": getattr(sitecustomize, "__file__", None),
                   "user_site_mark": getattr(sitecustomize, "USER_MARK", None),
                   "user_site_env": os.environ.get("USER_SITECUSTOMIZE_RAN"),
                   "steps": step, "attempt": attempt}, fh)
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
