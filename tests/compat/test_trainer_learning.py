"""cddp-train learns: ResNet-18 on Fashion-MNIST.

One epoch over the first 8,192 training images of Debian's
dataset-fashion-mnist (28x28, --data idx), batch 32, SGD (momentum 0.9,
weight decay 1e-4, the seed script's) with lr 0.005 annealed to 0 over the
epoch (--lr-schedule cosine), 2 threads, seed 0; then eval-mode accuracy on
the first 2,000 test images must reach 80%.

The recipe: with a constant lr, the eval-mode accuracy after one short
epoch swings with the last few steps (the BN running statistics trail the
weights): 75.3-81.8% over seeds 0-3 at lr 0.003, near 80% at the seed's
0.01 (PyTorch 71-75% there). Annealing the lr removes most of that swing:
over seeds 0-7 this recipe gives 81.9-84.5% (docs/trainer.md, "Learning").
Seed 0 and 2 threads make the run deterministic; it prints the accuracy
and the time it took.
"""
import gzip
import os
import re
import struct
import time

import pytest

from conftest import binary, run

FASHION = "/usr/share/datasets/fashion-mnist"


def subset(prefix, n, out):
    with gzip.open(f"{FASHION}/{prefix}-images-idx3-ubyte.gz") as fh:
        images = fh.read()
    with gzip.open(f"{FASHION}/{prefix}-labels-idx1-ubyte.gz") as fh:
        labels = fh.read()
    _, _, h, w = struct.unpack(">IIII", images[:16])
    (out / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">IIII", 0x803, n, h, w) + images[16:16 + n * h * w])
    (out / f"{prefix}-labels-idx1-ubyte").write_bytes(
        struct.pack(">II", 0x801, n) + labels[8:8 + n])


@pytest.mark.heavy
def test_resnet18_fashion_mnist_one_epoch(tmp_path):
    if not os.path.exists(f"{FASHION}/train-images-idx3-ubyte.gz"):
        pytest.skip("dataset-fashion-mnist is not installed (tools/setup.sh installs it)")
    subset("train", 8192, tmp_path)
    subset("t10k", 2000, tmp_path)
    t0 = time.monotonic()
    r = run([binary("cddp-train"), "--arch", "resnet18", "--data", f"idx:{tmp_path}",
             "--epochs", "1", "--batch-size", "32", "--lr", "0.005", "--lr-schedule", "cosine",
             "--seed", "0",
             "--threads", "2", "--eval", "--log-every", "64"], timeout=1800)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert re.search(r"^Epoch 0 \[0/256\] Loss: ", r.stdout, re.M), r.stdout
    acc = float(re.search(r"^test accuracy: (\d\.\d{4})$", r.stdout, re.M).group(1))
    print(f"resnet18, 8192 Fashion-MNIST images, 1 epoch: test accuracy {acc:.4f} "
          f"in {took:.1f} s")
    assert acc >= 0.80, r.stdout
