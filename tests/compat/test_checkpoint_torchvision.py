"""cddp checkpoints and weight files as torchvision sees them.

A torchvision state_dict (running stats and counters not at their defaults)
goes through --init's loader and the checkpoint writer (tests/helpers/
ckpt_tool.c): PyTorch reads the checkpoint's tensors, drops the optimizer's,
and loads the rest with load_state_dict(strict=True), getting back every
tensor bit for bit; the momentum buffers sit under their own prefix, one per
parameter. Then the checkpoint loader and --save's writer turn it back into a
weights file byte-identical to the one PyTorch wrote.
"""
import subprocess

import pytest

from conftest import ROOT, TORCH_PY, binary

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
