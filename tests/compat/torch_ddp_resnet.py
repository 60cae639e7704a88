"""PyTorch's reference for cddp-train's DDP tests: the seed script's loop
(section 3.4, with section 6's gradient accumulation) on a torchvision
ResNet, on CPU, over gloo.

    torchrun --standalone --nproc_per_node=2 torch_ddp_resnet.py --init w0.safetensors \
        --data DIR --batch-size 8 --steps 3 [--accum-steps 2] --out DIR

Under a launcher (WORLD_SIZE set) the model is wrapped in
DistributedDataParallel (defaults: 25 MiB buckets, broadcast_buffers) and
the data split by DistributedSampler(shuffle=False); micro-steps before the
last of each step run under no_sync(). Without a launcher it is the plain
single-process loop. Rank 0 writes OUT/state.safetensors (the state_dict
after the last step), OUT/losses.json (each step's loss, the mean of its
micro-batches' losses), and, under DDP, OUT/ddp.json: the bucket sizes
DDP's Reducer rebuilt after its first iteration.
"""
import argparse
import contextlib
import json
import os
import pathlib
import struct
import sys

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import safetensors_py as st  # noqa: E402


def read_idx(directory, prefix):
    """(images, labels) as cddp-train's --data idx feeds them: /255, normalised, 3 channels."""
    with open(os.path.join(directory, f"{prefix}-images-idx3-ubyte"), "rb") as fh:
        _, n, h, w = struct.unpack(">IIII", fh.read(16))
        images = torch.frombuffer(bytearray(fh.read(n * h * w)), dtype=torch.uint8)
    with open(os.path.join(directory, f"{prefix}-labels-idx1-ubyte"), "rb") as fh:
        fh.read(8)
        labels = torch.frombuffer(bytearray(fh.read(n)), dtype=torch.uint8).long()
    x = images.reshape(n, 1, h, w).float().div(255.0)
    x = (x - 0.2860) / 0.3530
    return x.expand(-1, 3, -1, -1).contiguous(), labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--init", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--accum-steps", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group(backend="gloo", init_method="env://")
    rank = dist.get_rank() if distributed else 0

    model = getattr(torchvision.models, args.arch)(num_classes=args.num_classes)
    model.load_state_dict(st.load(args.init)[0], strict=True)
    net = DDP(model) if distributed else model
    x, y = read_idx(args.data, "train")
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=False) if distributed else None
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    crit = torch.nn.CrossEntropyLoss()

    net.train()
    opt.zero_grad()
    losses, micro, step_loss = [], 0, 0.0
    for xb, yb in loader:
        last = (micro + 1) % args.accum_steps == 0
        ctx = net.no_sync() if distributed and not last else contextlib.nullcontext()
        with ctx:
            loss = crit(net(xb), yb) / args.accum_steps
            loss.backward()
        step_loss += loss.item()
        micro += 1
        if last:
            opt.step()
            opt.zero_grad()
            losses.append(step_loss)
            step_loss = 0.0
            if len(losses) == args.steps:
                break

    if rank == 0:
        out = pathlib.Path(args.out)
        st.save(out / "state.safetensors", {k: v.detach().clone() for k, v in
                                            model.state_dict().items()}, {"format": "pt"})
        (out / "losses.json").write_text(json.dumps(losses))
        if distributed:
            data = net._get_ddp_logging_data()
            sizes = [int(s) for s in str(data.get("rebuilt_bucket_sizes", "")).replace(",", " ")
                     .split()]
            (out / "ddp.json").write_text(json.dumps({"rebuilt_bucket_sizes": sizes}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
