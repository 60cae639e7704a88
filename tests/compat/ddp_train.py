"""The seeds' DDP training script, on CPU: gloo, init_method='env://',
DistributedSampler with set_epoch, DDP, rank 0 saving a checkpoint, and a
check that every rank ends with the same weights.

Run it under any launcher:
    cddprun --nproc_per_node=2 tests/compat/ddp_train.py --out DIR
    torchrun --nproc_per_node=2 tests/compat/ddp_train.py --out DIR

Rank 0 writes DIR/result.json: the launcher-visible environment, the loss
per epoch and a digest of the final weights. Launchers that give the same
environment give byte-identical results.

For side-by-side runs (tests/compat/side_by_side.py):
  --env-out DIR    every rank writes DIR/rank<R>.json: its whole environment
                   and the wall-clock times (time.time()) it entered the
                   script, before importing torch (t_enter), finished
                   init_process_group (t_init) and ended (t_end)
  --crash-rank R   rank R raises ValueError as it starts, under torch's
                   @record (so it leaves an error file); the other ranks
                   wait, without touching the network, until the launcher
                   stops them: a failure whose table does not depend on
                   which collective noticed it first
"""
import time

T_ENTER = time.time()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def write_env(args, rank, **times):
    """--env-out: this rank's environment and times, written whole (rename)."""
    if not args.env_out:
        return
    path = os.path.join(args.env_out, f"rank{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"env": dict(os.environ), "t_enter": T_ENTER, **times}, fh, sort_keys=True)
    os.replace(path + ".tmp", path)


@record
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--env-out")
    ap.add_argument("--crash-rank", type=int)
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if args.crash_rank is not None:
        write_env(args, rank)
        if rank == args.crash_rank:
            raise ValueError(f"rank {rank} failed on purpose")
        time.sleep(300)
        return
    dist.init_process_group(backend="gloo", init_method="env://")
    t_init = time.time()
    assert dist.get_rank() == rank and dist.get_world_size() == world_size

    torch.manual_seed(0)
    data = torch.randn(256, 20)
    labels = (data[:, 0] + 0.5 * data[:, 1] > 0).long()
    dataset = TensorDataset(data, labels)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(1 + rank)  # different initial weights per rank: DDP must broadcast
    model = DDP(nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total, n = torch.zeros(1), torch.zeros(1)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.detach() * len(y)
            n += len(y)
        dist.all_reduce(total)
        dist.all_reduce(n)
        losses.append(round(float(total / n), 6))

    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, flat) for g in gathered), "ranks disagree on the weights"
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "checkpoint.pt"))
        result = {
            "world_size": world_size,
            "losses": losses,
            "weights_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
            "env": {k: os.environ.get(k) for k in (
                "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS")},
        }
        with open(os.path.join(args.out, "result.json"), "w") as fh:
            json.dump(result, fh, sort_keys=True)
    dist.barrier()
    dist.destroy_process_group()
    write_env(args, rank, t_init=t_init, t_end=time.time())


if __name__ == "__main__":
    main()
