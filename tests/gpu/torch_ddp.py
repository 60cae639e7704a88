#!/usr/bin/env python3
"""The seed's DDP training script on a GPU (tools/gpu-check's ddp stage).

The seed's shape: init_process_group("nccl", env://), torch.cuda.set_device
(LOCAL_RANK), DistributedSampler with set_epoch, DDP(device_ids=[LOCAL_RANK]),
rank 0 saving a checkpoint. A torchvision ResNet-18 (10 classes) on random
32x32 images, SGD with momentum, cuDNN deterministic so that two launchers
giving the same environment give the same losses. Run it under any launcher:

    cddprun --nproc_per_node=2 --no-python tests/gpu/one_gpu_rank.sh python3 tests/gpu/torch_ddp.py --out DIR
    torchrun --nproc_per_node=2 --no-python tests/gpu/one_gpu_rank.sh python3 tests/gpu/torch_ddp.py --out DIR

--probe: only one allreduce (the NCCL set-up check). --bench: allreduce
(sum, fp32) bus bandwidth from --min-bytes to --max-bytes, doubling, timed
as cddp-collbench --bench times ours (the same iterations per size, 2 warm-up
allreduces, a barrier, the slowest rank's time; bus bandwidth as nccl-tests
defines it), for the ddp stage's side-by-side. --device cpu uses gloo (the
CPU self-test). Rank 0 writes DIR/result.json: the loss per epoch, the final
loss, a digest of the final weights (or the probe's or the bench's result),
torch's and NCCL's versions.
"""
import argparse
import hashlib
import json
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-bytes", type=int, default=128 << 20)
    ap.add_argument("--iters", type=int, default=0, help="per size; 0: by size, as collbench")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    import torchvision
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    t0 = time.time()
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group(backend="nccl" if args.device == "cuda" else "gloo",
                            init_method="env://")
    assert dist.get_rank() == rank and dist.get_world_size() == world_size
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if args.device == "cuda" else None
    result = {"world_size": world_size, "torch": torch.__version__, "nccl": nccl,
              "device": str(dev)}

    if args.probe:
        x = torch.full((1 << 20,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        want = world_size * (world_size + 1) / 2
        result["probe_ok"] = bool((x == want).all().item())
    elif args.bench:
        result["bench"] = bench(args, dist, torch, dev, world_size)
    else:
        g = torch.Generator().manual_seed(0)
        data = torch.rand(args.samples, 3, 32, 32, generator=g)
        labels = torch.randint(0, 10, (args.samples,), generator=g)
        dataset = TensorDataset(data, labels)
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                     seed=0)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
        torch.manual_seed(1 + rank)  # different initial weights per rank: DDP must broadcast
        model = torchvision.models.resnet18(num_classes=10).to(dev)
        model = DDP(model, device_ids=[local_rank] if args.device == "cuda" else None)
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        losses, steps = [], 0
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            total = torch.zeros(2, dtype=torch.float64, device=dev)
            for x, y in loader:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                total += torch.stack([loss.detach().double() * len(y),
                                      torch.tensor(float(len(y)), dtype=torch.float64,
                                                   device=dev)])
                steps += 1
            dist.all_reduce(total)
            losses.append(float(total[0] / total[1]))
        flat = torch.cat([p.detach().flatten() for p in model.module.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world_size)]
        dist.all_gather(gathered, flat)
        assert all(torch.equal(t, flat) for t in gathered), "ranks disagree on the weights"
        result.update(losses=losses, final_loss=losses[-1], steps=steps,
                      weights_sha256=hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest())
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(args.out, "checkpoint.pt"))
    result["seconds"] = round(time.time() - t0, 2)
    if rank == 0:
        with open(os.path.join(args.out, "result.json"), "w") as fh:
            json.dump(result, fh, sort_keys=True)
    # (NCCL: the barrier on this rank's device, not one guessed from the rank)
    dist.barrier(**({"device_ids": [local_rank]} if args.device == "cuda" else {}))
    dist.destroy_process_group()


def bench(args, dist, torch, dev, world):
    """Rows of bytes, iters, time_us, algbw_gbps, busbw_gbps (trainer/collbench.c's)."""
    rows = []
    buf = torch.zeros(args.max_bytes // 4, dtype=torch.float32, device=dev)
    bytes_ = args.min_bytes
    while bytes_ <= args.max_bytes:
        x = buf[:bytes_ // 4]
        iters = args.iters or min(max((512 << 20) // bytes_, 3), 50)
        for _ in range(2):
            dist.all_reduce(x)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)  # the slowest rank's time
        per = float(el.item()) / iters
        algbw = bytes_ / per / 1e9
        rows.append({"bytes": bytes_, "iters": iters, "time_us": round(per * 1e6, 1),
                     "algbw_gbps": round(algbw, 4),
                     "busbw_gbps": round(algbw * 2 * (world - 1) / world, 4)})
        bytes_ *= 2
    return rows


if __name__ == "__main__":
    main()
