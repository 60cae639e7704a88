"""PyTorch's side of bench_trainer.py: the seed script's training step on the CPU.

    /usr/bin/python3 tests/bench/torch_train.py --arch resnet50 --image-size 64 \
        --batch-size 32 --threads 2 --steps 8

Runs the same step as cddp-train (a synthetic N(0,1) batch, forward,
CrossEntropyLoss, backward, SGD(lr 0.01, momentum 0.9, weight decay 1e-4))
and prints one line per step, `step N time S`, then `peak_rss_kb K`.
"""
import argparse
import resource
import time

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--num-classes", type=int, default=1000)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.arch)(num_classes=a.num_classes)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    crit = torch.nn.CrossEntropyLoss()
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(a.batch_size, 3, a.image_size, a.image_size)
        y = torch.randint(0, a.num_classes, (a.batch_size,))
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        print(f"step {step} time {time.perf_counter() - t0:.6f}", flush=True)
    print(f"peak_rss_kb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)


if __name__ == "__main__":
    main()
