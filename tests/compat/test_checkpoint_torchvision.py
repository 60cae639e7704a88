"""cddp checkpoints and weight files as torchvision sees them.

A torchvision state_dict (running stats and counters not at their defaults)
goes through --init's loader and the checkpoint writer (tests/helpers/
ckpt_tool.c): PyTorch reads the checkpoint's tensors, drops the optimizer's,
and loads the rest with load_state_dict(strict=True), getting back every
tensor bit for bit; the momentum buffers sit under their own prefix, one per
parameter. Then the checkpoint loader and --save's writer turn it back into a
weights file byte-identical to the one PyTorch wrote.
"""
import struct
import subprocess

import pytest

from conftest import ROOT, TORCH_PY, binary, run

SCRIPT = r"""
import subprocess, sys, torch, torchvision
tests_dir, tool, tmp = sys.argv[1:4]
sys.path.insert(0, tests_dir)
import safetensors_py as st
for arch in sys.argv[4:]:
    w, ck, w2 = f"{tmp}/{arch}.w", f"{tmp}/{arch}.ckpt", f"{tmp}/{arch}.w2"
    torch.manual_seed(1)
    model = getattr(torchvision.models, arch)(num_classes=7)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.normal_()
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 2.0)
            else:
                buf.fill_(12345)
    sd = model.state_dict()
    st.save(w, sd, {"format": "pt", "arch": arch, "num_classes": "7"})
    for cmd, src, dst in (("from-weights", w, ck), ("to-weights", ck, w2)):
        r = subprocess.run([tool, cmd, arch, "7", src, dst], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    tensors, meta = st.load(ck)
    assert meta["cddp.checkpoint"] == "1" and meta["arch"] == arch and meta["step"] == "7", meta
    weights = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    assert list(weights) == list(sd), "not in state_dict order"
    fresh = getattr(torchvision.models, arch)(num_classes=7)
    fresh.load_state_dict(weights, strict=True)
    for k, v in fresh.state_dict().items():
        assert v.dtype == sd[k].dtype and torch.equal(v, sd[k]), k
    params = dict(model.named_parameters())
    moms = {k[len("optimizer.momentum_buffer."):]: v for k, v in tensors.items()
            if k.startswith("optimizer.momentum_buffer.")}
    assert list(moms) == list(params), "one momentum buffer per parameter, in order"
    for k, v in moms.items():
        assert torch.equal(v, params[k].detach() * 0.5), k
    with open(w, "rb") as a, open(w2, "rb") as b:
        assert a.read() == b.read(), "--save's bytes differ from PyTorch's"
    print(arch, len(weights), len(moms))
"""


@pytest.mark.heavy
@pytest.mark.torch
def test_checkpoint_loads_in_torchvision(tmp_path, torch_python):
    r = subprocess.run([TORCH_PY, "-c", SCRIPT, str(ROOT / "tests"), binary("cddp-ckpt-tool"),
                        str(tmp_path), "resnet18", "resnet50"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["resnet18", "122", "62", "resnet50", "320", "161"]


# ---------------------------------------------------------------------------
# A checkpoint written by a real cddp-train run is a PyTorch training state.

BATCH, SIZE, CLASSES = 16, 32, 10
LR, MOMENTUM, WD = 0.01, 0.9, 1e-4
REL_TOL, ABS_TOL = 1e-4, 2e-5  # as tests/compat/test_trainer_parity.py, which says why


def write_idx(directory, prefix, images, labels):
    """MNIST-style IDX files (uncompressed): images (N, H, W) uint8, labels (N,) uint8."""
    n, h, w = images.shape
    with open(directory / f"{prefix}-images-idx3-ubyte", "wb") as fh:
        fh.write(struct.pack(">IIII", 0x803, n, h, w) + images.tobytes())
    with open(directory / f"{prefix}-labels-idx1-ubyte", "wb") as fh:
        fh.write(struct.pack(">II", 0x801, n) + labels.tobytes())


def close(torch, what, ours, ref):
    """ours == ref within 1e-4 of ref's largest value, or 2e-5 where ref is all zero."""
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, what
    if ref.dtype == torch.int64:
        assert torch.equal(ours, ref), f"{what}: {ours} != {ref}"
        return
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    if scale == 0:
        assert err < ABS_TOL, f"{what}: abs error {err:.3g}"
    else:
        assert err / scale < REL_TOL, f"{what}: relative error {err / scale:.3g}"


@pytest.mark.heavy
@pytest.mark.torch
def test_trainer_checkpoint_continues_in_pytorch(tmp_path, torch_python):
    """cddp-train trains 2 steps from torchvision's weights and stops with a
    checkpoint: its tensors load into resnet18 strictly, agree with PyTorch's
    own 2 steps (weights, BN statistics, counters, and SGD's momentum
    buffers), and PyTorch's SGD, given the checkpoint's momentum buffers,
    takes the same third step as cddp-train resuming from it."""
    import numpy as np
    import torch
    import torchvision

    import safetensors_py as st

    torch.set_num_threads(2)
    rng = np.random.default_rng(11)
    xs = rng.integers(0, 256, (3 * BATCH, SIZE, SIZE), dtype=np.uint8)
    ys = rng.permutation(np.arange(3 * BATCH) % CLASSES).astype(np.uint8)
    data = tmp_path / "data"
    data.mkdir()
    write_idx(data, "train", xs, ys)
    write_idx(data, "t10k", xs[:BATCH], ys[:BATCH])
    x = torch.from_numpy(xs).float().div(255.0).unsqueeze(1)
    x = ((x - 0.2860) / 0.3530).expand(-1, 3, -1, -1).contiguous()
    y = torch.from_numpy(ys).long()
    batches = [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(3)]

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=CLASSES, zero_init_residual=True)
    w0 = tmp_path / "w0.safetensors"
    st.save(w0, model.state_dict(), {"format": "pt"})

    ck, s3 = tmp_path / "ck.safetensors", tmp_path / "s3.safetensors"
    common = [binary("cddp-train"), "--arch", "resnet18", "--data", f"idx:{data}",
              "--batch-size", BATCH, "--epochs", 1, "--no-shuffle", "--lr", LR, "--momentum",
              MOMENTUM, "--weight-decay", WD, "--init", w0, "--threads", 2, "--checkpoint", ck]
    r = run(common + ["--steps", 2], timeout=600)
    assert r.returncode == 0, r.stderr
    tensors, meta = st.load(ck)  # before the resumed run replaces it
    r = run(common + ["--steps", 3, "--save", s3], timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"=> resumed from checkpoint '{ck}' (epoch 0, batch 2, step 2)")

    # PyTorch's first 2 steps.
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    crit = torch.nn.CrossEntropyLoss()
    model.train()

    def step(m, o, batch):
        o.zero_grad()
        crit(m(batch[0]), batch[1]).backward()
        o.step()

    for b in batches[:2]:
        step(model, opt, b)

    # The checkpoint as resnet18 loads it.
    assert meta["arch"] == "resnet18" and meta["cddp.checkpoint"] == "1", meta
    assert (meta["epoch"], meta["step"], meta["optimizer.steps"], meta["sampler.epoch_offset"],
            meta["sampler.batch_size"], meta["sampler.shuffle"]) == ("0", "2", "2", "32", "16",
                                                                     "0"), meta
    prefix = "optimizer.momentum_buffer."
    weights = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    moms = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    ours = torchvision.models.resnet18(num_classes=CLASSES)
    ours.load_state_dict(weights, strict=True)
    for k, v in model.state_dict().items():
        close(torch, f"after 2 steps: {k}", weights[k], v)
    params = dict(model.named_parameters())
    assert list(moms) == list(params)
    for k, p in params.items():
        close(torch, f"momentum buffer of {k}", moms[k], opt.state[p]["momentum_buffer"])

    # PyTorch continues from the checkpoint; cddp-train resumed from it.
    opt2 = torch.optim.SGD(ours.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    for k, p in ours.named_parameters():
        opt2.state[p]["momentum_buffer"] = moms[k].clone()
    ours.train()
    step(ours, opt2, batches[2])
    resumed = st.load(s3)[0]
    assert list(resumed) == list(ours.state_dict())
    for k, v in ours.state_dict().items():
        close(torch, f"step 3 from the checkpoint: {k}", resumed[k], v)
