"""cddp-train's datasets against torchvision's preprocessing, sample for sample.

- idx: Debian's Fashion-MNIST (gzipped IDX) through cddp's idx dataset equals
  ToTensor + Normalize((0.2860,), (0.3530,)) on the same images, replicated to
  3 channels, bit for bit, with the same labels, for both splits.
- folder: an ImageFolder tree of JPEGs written by PIL (RGB 4:2:0 and 4:4:4,
  grayscale, landscape, portrait, up- and downscaled, odd crops, nested
  folders, upper-case extensions) through cddp's folder dataset equals
  torchvision.datasets.ImageFolder with Resize(S), CenterCrop(S), ToTensor,
  Normalize(ImageNet) bit for bit: same order, same labels, same floats.
"""
import os
import subprocess

import pytest

from conftest import ROOT, TORCH_PY, binary

# Debian's dataset-fashion-mnist, where cddp-dataset-dump's idx set reads it.
FASHION = "/usr/share/datasets/fashion-mnist"

IDX_SCRIPT = r"""
import gzip, sys
import numpy as np, torch
import torchvision.transforms as T
from PIL import Image
sys.path.insert(0, sys.argv[1])
import safetensors_py as st
root = sys.argv[4]
norm = T.Compose([T.ToTensor(), T.Normalize((0.2860,), (0.3530,))])
for split, prefix, dump in (("train", "train", sys.argv[2]), ("test", "t10k", sys.argv[3])):
    with gzip.open(f"{root}/{prefix}-images-idx3-ubyte.gz") as fh:
        imgs = np.frombuffer(fh.read(), dtype=np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(f"{root}/{prefix}-labels-idx1-ubyte.gz") as fh:
        labels = np.frombuffer(fh.read(), dtype=np.uint8, offset=8)
    got, meta = st.load(dump)
    n = got["images"].shape[0]
    want = torch.stack([norm(Image.fromarray(imgs[i], mode="L")).expand(3, 28, 28)
                        for i in range(n)])
    assert got["images"].shape == want.shape, (got["images"].shape, want.shape)
    assert torch.equal(got["images"], want), (got["images"] - want).abs().max()
    assert torch.equal(got["labels"], torch.from_numpy(labels[:n].astype(np.int64)))
    assert meta["len"] == str(len(labels)) and meta["num_classes"] == "10", meta
    print(split, n)
"""

FOLDER_MAKE = r"""
import os, sys
import numpy as np
from PIL import Image
root = sys.argv[1]
rng = np.random.default_rng(7)
def img(w, h, mode="RGB"):
    # smooth gradients plus noise: realistic enough for the JPEG coder and the filter
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / max(w - 1, 1), yy * 255 / max(h - 1, 1),
                     (xx + yy) * 127 / max(w + h - 2, 1)], -1)
    a = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    im = Image.fromarray(a, "RGB")
    return im.convert("L") if mode == "L" else im
files = {
    "cat/b.jpg": (img(300, 200), {"quality": 90}),
    "cat/a.JPG": (img(37, 53), {"quality": 95, "subsampling": 0}),
    "cat/sub/z.jpeg": (img(20, 15), {"quality": 85}),
    "cat/sub dir/y.jpg": (img(64, 64, "L"), {"quality": 90}),
    "ant/x.jpg": (img(33, 47), {"quality": 75}),
    "ant/w.jpg": (img(150, 151), {"quality": 92, "subsampling": 1}),
    "dog/v.jpeg": (img(97, 31), {"quality": 88}),
}
for rel, (im, kw) in files.items():
    os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
    im.save(os.path.join(root, rel), "JPEG", **kw)
with open(os.path.join(root, "dog", "notes.txt"), "w") as fh:
    fh.write("not an image\n")
"""

FOLDER_CHECK = r"""
import sys, torch
import torchvision.datasets as D
import torchvision.transforms as T
sys.path.insert(0, sys.argv[1])
import safetensors_py as st
root = sys.argv[2]
for arg in sys.argv[3:]:
    size, dump = arg.split(":", 1)
    size = int(size)
    tf = T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = D.ImageFolder(root, transform=tf)
    got, meta = st.load(dump)
    assert meta["len"] == str(len(ds)) and meta["num_classes"] == str(len(ds.classes)), meta
    want = torch.stack([ds[i][0] for i in range(len(ds))])
    labels = torch.tensor([ds[i][1] for i in range(len(ds))])
    assert torch.equal(got["labels"], labels), (got["labels"], labels)
    diff = (got["images"] - want).abs()
    bad = [(i, ds.samples[i][0], float(diff[i].max())) for i in range(len(ds))
           if diff[i].max() > 0]
    assert not bad, (size, bad)
    print(size, len(ds))
"""


@pytest.mark.heavy
@pytest.mark.torch
def test_idx_matches_torchvision(tmp_path, torch_python):
    if not os.path.exists(f"{FASHION}/train-images-idx3-ubyte.gz"):
        # (a machine without Debian's package, like the device machine)
        pytest.skip("dataset-fashion-mnist is not installed (tools/setup.sh installs it)")
    dumps = []
    for split in ("train", "test"):
        out = tmp_path / f"{split}.safetensors"
        r = subprocess.run([binary("cddp-dataset-dump"), "idx", split, out, "--first", "300"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        dumps.append(out)
    r = subprocess.run([TORCH_PY, "-c", IDX_SCRIPT, str(ROOT / "tests")] + [str(d) for d in dumps]
                       + [FASHION],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["train", "300", "test", "300"]


@pytest.mark.heavy
@pytest.mark.torch
def test_folder_matches_torchvision(tmp_path, torch_python):
    root = tmp_path / "images"
    r = subprocess.run([TORCH_PY, "-c", FOLDER_MAKE, str(root)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    dumps = []
    for size in (32, 64):  # downscaled and upscaled; crops with odd margins either way
        out = tmp_path / f"dump{size}.safetensors"
        r = subprocess.run([binary("cddp-dataset-dump"), f"folder:{root}", "train", out,
                            "--image-size", str(size)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        dumps.append(f"{size}:{out}")
    r = subprocess.run([TORCH_PY, "-c", FOLDER_CHECK, str(ROOT / "tests"), str(root)] + dumps,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["32", "7", "64", "7"]
