"""cddp-train's data parallelism against its single-process self and against
PyTorch, number for number.

All runs start from torchvision's resnet18(num_classes=10,
zero_init_residual=True) weights (--init; see test_trainer_parity.py on
why: a well-conditioned start where 1e-4 separates a real difference from
rounding) and train on IDX files this test writes, without shuffling, with
SGD(lr 0.01, momentum 0.9, weight decay 1e-4). Tensors are compared as in
the parity test: within 1e-4 relative error (max |a - b| / max |b|), or,
for tensors that start at zero, 2e-5 absolute per element; counters exactly.

  - SyncBatchNorm: 2 ranks x batch 8 with --sync-bn (under cddprun) equal
    1 rank x batch 16 on the same 16 samples per step, every tensor after 3
    steps; without --sync-bn they do not (each rank normalises by its own
    half-batch), which shows the comparison can fail.
  - Gradient accumulation: --accum-steps 2 at batch 8 equals PyTorch's
    loop doing the same (loss / 2, two backwards, one step): every loss and
    every tensor after 3 steps. (Not batch 16: batch norm normalises each
    micro-batch by its own statistics, in PyTorch as here, so accumulation
    changes the model's function; see docs/distributed.md.)
  - DDP (heavy): 2 ranks under cddprun equal 2 ranks of PyTorch's
    DistributedDataParallel over gloo under torchrun (broadcast_buffers,
    bucketed averaging, no_sync for --accum-steps 2), loss for loss and
    tensor for tensor; and our bucket sizes are the ones PyTorch's Reducer
    rebuilds after its first iteration.
"""
import json
import os
import re

import pytest

from conftest import ROOT, binary, free_port, run, torchrun_cmd
from test_trainer_parity import ABS_TOL, REL_TOL, write_idx

TORCH_SCRIPT = ROOT / "tests" / "compat" / "torch_ddp_resnet.py"
SIZE, CLASSES = 32, 10


def setup_run(tmp_path, n_train):
    """Writes the IDX data and the start weights; returns (data dir, weights path)."""
    import numpy as np
    import torch
    import torchvision

    import safetensors_py as st

    rng = np.random.default_rng(11)
    train_x = rng.integers(0, 256, (n_train, SIZE, SIZE), dtype=np.uint8)
    train_y = (np.arange(n_train) % CLASSES).astype(np.uint8)
    rng.shuffle(train_y)
    data = tmp_path / "data"
    data.mkdir()
    write_idx(data, "train", train_x, train_y)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=CLASSES, zero_init_residual=True)
    w0 = tmp_path / "w0.safetensors"
    st.save(w0, {k: v.clone() for k, v in model.state_dict().items()}, {"format": "pt"})
    return data, w0


def train_args(data, w0, batch, steps, *extra):
    return ["--arch", "resnet18", "--data", f"idx:{data}", "--batch-size", batch, "--epochs", 1,
            "--steps", steps, "--no-shuffle", "--lr", 0.01, "--momentum", 0.9,
            "--weight-decay", 1e-4, "--init", w0, *extra]


def cddprun(tmp_path, nproc, args, env=None, timeout=600):
    return run([binary("cddprun"), f"--nproc_per_node={nproc}", "--standalone",
                f"--log_dir={tmp_path / 'logs'}", binary("cddp-train"), *args],
               env=env, timeout=timeout)


def worst_error(a, b, start):
    """(worst relative error over tensors that do not start at zero, worst absolute
    error over those that do, [names over the tolerances])."""
    import torch
    assert list(a) == list(b)
    rel, abs_, bad = 0.0, 0.0, []
    for k, r in b.items():
        o = a[k]
        assert o.shape == r.shape and o.dtype == r.dtype, k
        if r.dtype == torch.int64:
            if not torch.equal(o, r):
                bad.append(k)
        elif not start[k].any():
            e = (o - r).abs().max().item()
            abs_ = max(abs_, e)
            if e >= ABS_TOL:
                bad.append(k)
        else:
            e = ((o - r).abs().max() / r.abs().max()).item()
            rel = max(rel, e)
            if e >= REL_TOL:
                bad.append(k)
    return rel, abs_, bad


def losses_of(stderr, rank=None):
    tag = rf"rank{rank} " if rank is not None else ""
    return [float(m.group(1)) for m in
            re.finditer(rf"cddp-train\[\d+\] {tag}\S+ DEBUG T0002: step \d+ loss (\S+)", stderr)]


@pytest.mark.torch
def test_sync_bn_two_ranks_equal_one_rank_double_batch(torch_python, tmp_path):
    import safetensors_py as st

    data, w0 = setup_run(tmp_path, 48)
    one, two, plain = (tmp_path / f for f in ("one.st", "two.st", "plain.st"))
    r = run([binary("cddp-train"), *train_args(data, w0, 16, 3, "--save", one, "--threads", 1)],
            timeout=600)
    assert r.returncode == 0, r.stderr
    r = cddprun(tmp_path, 2, train_args(data, w0, 8, 3, "--sync-bn", "--save", two))
    assert r.returncode == 0, r.stderr[-3000:]
    r = cddprun(tmp_path, 2, train_args(data, w0, 8, 3, "--save", plain))
    assert r.returncode == 0, r.stderr[-3000:]
    start = st.load(w0)[0]
    ref = st.load(one)[0]
    rel, abs_, bad = worst_error(st.load(two)[0], ref, start)
    print(f"--sync-bn 2 x 8 vs 1 x 16: worst rel {rel:.2e}, zero-start abs {abs_:.2e}")
    assert not bad, f"differ beyond tolerance: {bad}"
    rel, abs_, bad = worst_error(st.load(plain)[0], ref, start)
    print(f"plain BN 2 x 8 vs 1 x 16: worst rel {rel:.2e}, zero-start abs {abs_:.2e}")
    assert rel > 100 * REL_TOL and bad, "without --sync-bn the ranks should normalise apart"


@pytest.mark.torch
def test_accum_steps_equal_pytorch_accumulation(torch_python, tmp_path):
    import safetensors_py as st

    data, w0 = setup_run(tmp_path, 48)
    ours, theirs = tmp_path / "ours.st", tmp_path / "torch"
    theirs.mkdir()
    r = run([binary("cddp-train"), *train_args(data, w0, 8, 3, "--accum-steps", 2, "--save", ours,
                                               "--threads", 1)],
            env=dict(os.environ, LOGLEVEL="DEBUG"), timeout=600)
    assert r.returncode == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    t = run([torch_python, TORCH_SCRIPT, "--init", w0, "--data", data, "--batch-size", 8,
             "--steps", 3, "--accum-steps", 2, "--out", theirs], env=env, timeout=600)
    assert t.returncode == 0, t.stderr
    ref_losses = json.loads((theirs / "losses.json").read_text())
    our_losses = losses_of(r.stderr)
    assert len(our_losses) == 3 == len(ref_losses), r.stderr
    for o, t in zip(our_losses, ref_losses):
        assert abs(o - t) / abs(t) < REL_TOL, (our_losses, ref_losses)
    rel, abs_, bad = worst_error(st.load(ours)[0], st.load(theirs / "state.safetensors")[0],
                                 st.load(w0)[0])
    print(f"--accum-steps 2 vs PyTorch: worst rel {rel:.2e}, zero-start abs {abs_:.2e}")
    assert not bad, f"differ beyond tolerance: {bad}"


@pytest.mark.torch
@pytest.mark.heavy
@pytest.mark.parametrize("accum", [1, 2])
def test_ddp_equals_pytorch_ddp(torch_python, tmp_path, accum):
    import safetensors_py as st

    steps, batch = 3, 8
    data, w0 = setup_run(tmp_path, 2 * batch * accum * steps)
    ours, theirs = tmp_path / "ours.st", tmp_path / "torch"
    theirs.mkdir()
    r = cddprun(tmp_path, 2, train_args(data, w0, batch, steps, "--accum-steps", accum,
                                        "--save", ours),
                env=dict(os.environ, LOGLEVEL="DEBUG"))
    assert r.returncode == 0, r.stderr[-3000:]
    env = dict(os.environ, OMP_NUM_THREADS="1", LC_ALL="C.UTF-8")
    t = run(torchrun_cmd() + ["--nproc_per_node=2", f"--master_port={free_port()}",
             TORCH_SCRIPT, "--init", w0, "--data", data, "--batch-size", batch, "--steps", steps,
             "--accum-steps", accum, "--out", theirs], env=env, timeout=600, cwd=tmp_path)
    assert t.returncode == 0, t.stdout[-2000:] + t.stderr[-3000:]
    ref_losses = json.loads((theirs / "losses.json").read_text())
    our_losses = losses_of(r.stderr, rank=0)
    assert len(our_losses) == steps == len(ref_losses), r.stderr[-3000:]
    for o, x in zip(our_losses, ref_losses):
        assert abs(o - x) / abs(x) < REL_TOL, (our_losses, ref_losses)
    rel, abs_, bad = worst_error(st.load(ours)[0], st.load(theirs / "state.safetensors")[0],
                                 st.load(w0)[0])
    print(f"DDP 2 ranks, accum {accum}, vs PyTorch DDP: worst rel {rel:.2e}, "
          f"zero-start abs {abs_:.2e}")
    assert not bad, f"differ beyond tolerance: {bad}"
    sizes = [int(m.group(1)) for m in
             re.finditer(r"rank0 \S+ DEBUG T6204: bucket \d+: (\d+) bytes", r.stderr)]
    torch_sizes = json.loads((theirs / "ddp.json").read_text())["rebuilt_bucket_sizes"]
    assert sizes == torch_sizes, (sizes, torch_sizes)
