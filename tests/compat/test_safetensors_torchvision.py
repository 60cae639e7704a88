"""torchvision state_dicts through cddp's C safetensors reader and writer.

A torchvision ResNet's state_dict (with BN running stats and num_batches_tracked
set to values that are not the defaults) is written by the Python writer,
read and written again by the C code (tests/helpers/st_copy.c), and loaded back
into a fresh torchvision model with strict=True. The C file must be byte for
byte the Python file, keep the state_dict's order, and every tensor must come
back bit-identical with its dtype (I64 scalars for num_batches_tracked).
"""
import subprocess

import pytest

from conftest import ROOT, TORCH_PY, binary

SCRIPT = r"""
import subprocess, sys, torch, torchvision
tests_dir, copy_bin, tmp = sys.argv[1:4]
sys.path.insert(0, tests_dir)
import safetensors_py as st
for arch in sys.argv[4:]:
    src, dst = f"{tmp}/{arch}.py.safetensors", f"{tmp}/{arch}.c.safetensors"
    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(num_classes=10)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.normal_()
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 2.0)
            elif name.endswith("num_batches_tracked"):
                buf.fill_(2**40 + len(name))
    sd = model.state_dict()
    meta = {"arch": arch, "note": "caf\u00e9 \"quoted\"\n"}
    st.save(src, sd, meta)
    r = subprocess.run([copy_bin, src, dst], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with open(src, "rb") as a, open(dst, "rb") as b:
        assert a.read() == b.read(), f"{arch}: the C writer's bytes differ from Python's"
    tensors, got_meta = st.load(dst)
    assert got_meta == meta, got_meta
    assert list(tensors) == list(sd), f"{arch}: order differs from the state_dict's"
    fresh = getattr(torchvision.models, arch)(num_classes=10)
    fresh.load_state_dict(tensors, strict=True)
    back = fresh.state_dict()
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(back[k], v), k
    nbt = tensors["bn1.num_batches_tracked"]
    assert nbt.dtype == torch.int64 and nbt.shape == torch.Size([]), nbt
    print(arch, len(sd))
"""


@pytest.mark.heavy
@pytest.mark.torch
def test_state_dict_round_trip(tmp_path, torch_python):
    archs = ["resnet18", "resnet50", "resnet152"]
    r = subprocess.run([TORCH_PY, "-c", SCRIPT, str(ROOT / "tests"), binary("cddp-st-copy"),
                        str(tmp_path)] + archs, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    # state_dict entries (trainer.md section 7: 932 for resnet152, 320 for resnet50)
    assert r.stdout.split() == ["resnet18", "122", "resnet50", "320", "resnet152", "932"]


def test_c_reader_refuses_what_python_refuses(tmp_path):
    """A few corruptions written from Python: the C reader names each problem."""
    import struct

    def image(header, data=b""):
        h = header.encode()
        return struct.pack("<Q", len(h)) + h + data

    cases = {
        "dup": (image('{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},'
                      '"a":{"dtype":"F32","shape":[],"data_offsets":[4,8]}}', b"\0" * 8),
                "duplicate tensor name 'a'"),
        "trunc": (image('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', b"\0" * 9),
                  "run past the end"),
        "nobrace": (image('  {}'), "does not start with '{'"),
    }
    for name, (blob, msg) in cases.items():
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(blob)
        r = subprocess.run([binary("cddp-st-copy"), p], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1, (name, r.stderr)
        assert msg in r.stderr and str(p) in r.stderr, (name, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
