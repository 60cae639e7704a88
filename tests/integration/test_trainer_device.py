"""cddp-train's --device, CDDP_DEVICE and --amp on a machine without a GPU.

--device auto (the default) falls back to the CPU with one T2001 line
saying why, and trains; --device cuda (or CDDP_DEVICE=cuda) that cannot be
had is one line naming the flag, exit 2, before anything is built; bad
values of --device, CDDP_DEVICE, --amp and --tf32 are refused the same
way; --device given beats CDDP_DEVICE; --amp other than off on the CPU is
refused. On a machine with a visible GPU the fallback tests skip (the run
would use it: tools/gpu-check covers that). Checkpoints carry nothing
device-bound: no key or metadata names a device.
"""
import json
import os
import pathlib
import shutil
import struct

import pytest

from conftest import BUILD, binary, run

TINY = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-samples", "8",
        "--batch-size", "4", "--num-classes", "10", "--threads", "2", "--epochs", "1"]


def has_cuda_build():
    cfg = BUILD / "config.h"
    return cfg.exists() and "#define CDDP_HAVE_CUDA 1" in cfg.read_text()


def gpu_visible():
    return any(pathlib.Path("/dev").glob("nvidia[0-9]*")) and shutil.which("nvidia-smi")


def train(*args, env_extra=None, drop=("CDDP_DEVICE",), timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["LOGLEVEL"] = "INFO"
    env.update(env_extra or {})
    r = run([binary("cddp-train")] + [str(a) for a in args], timeout=timeout, env=env)
    assert "Sanitizer" not in r.stderr and "runtime error:" not in r.stderr, r.stderr
    return r


def refused(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert r.stdout == ""
    return lines[0]


no_gpu = pytest.mark.skipif(bool(gpu_visible()), reason="a GPU is visible: auto would use it")


@no_gpu
@pytest.mark.parametrize("how", [[], ["--device", "auto"], ["--device=auto"]])
def test_auto_falls_back_to_cpu_and_trains(how):
    r = train(*TINY, *how)
    assert r.returncode == 0, r.stderr
    assert "Epoch 0 finished, avg loss:" in r.stdout
    notes = [l for l in r.stderr.splitlines() if "T2001" in l]
    assert len(notes) == 1, r.stderr
    why = "no CUDA device is visible" if has_cuda_build() else "built without CUDA"
    assert why in notes[0], notes[0]
    assert "cpu backend" in r.stderr  # T0001


@no_gpu
def test_cddp_device_env_auto_and_cpu():
    r = train(*TINY, env_extra={"CDDP_DEVICE": "auto"})
    assert r.returncode == 0 and "T2001" in r.stderr, r.stderr
    r = train(*TINY, env_extra={"CDDP_DEVICE": "cpu"})
    assert r.returncode == 0, r.stderr
    assert "T2001" not in r.stderr  # asked for: nothing to explain
    assert "Epoch 0 finished" in r.stdout


@no_gpu
@pytest.mark.parametrize("args, env", [
    (["--device", "cuda"], {}),
    (["--device=cuda"], {}),
    ([], {"CDDP_DEVICE": "cuda"}),
    (["--device", "cuda"], {"CUDA_VISIBLE_DEVICES": ""}),
    (["--device", "cuda"], {"CDDP_DEVICE": "cpu"}),  # the flag beats the variable
    (["--device", "cuda:0"], {}),  # a pinned device, whatever LOCAL_RANK says
    ([], {"CDDP_DEVICE": "cuda:1"}),
])
def test_cuda_without_a_gpu_refused(args, env):
    r = train(*TINY, *args, env_extra=env)
    why = "no CUDA device is visible" if has_cuda_build() else "built without CUDA"
    refused(r, "cddp-train: --device cuda:", why)


def test_flag_beats_environment():
    r = train(*TINY, "--device", "cpu", env_extra={"CDDP_DEVICE": "cuda"})
    assert r.returncode == 0, r.stderr
    assert "T2001" not in r.stderr and "Epoch 0 finished" in r.stdout


@pytest.mark.parametrize("args, env, needle", [
    (["--device", "gpu"], {}, "--device: 'gpu' is not auto, cpu, cuda or cuda:N"),
    (["--device", ""], {}, "--device: '' is not auto, cpu, cuda or cuda:N"),
    (["--device", "cuda:x"], {}, "--device: 'cuda:x' is not auto, cpu, cuda or cuda:N"),
    (["--device"], {}, "--device: needs a value"),
    ([], {"CDDP_DEVICE": "tpu"}, "CDDP_DEVICE: 'tpu' is not auto, cpu, cuda or cuda:N"),
    (["--amp", "fp8"], {}, "--amp: 'fp8' is not off, bf16 or fp16"),
    (["--tf32", "yes"], {}, "--tf32: 'yes' is not conv, all or off"),
    (["--cudnn-workspace-mb", "0"], {}, "--cudnn-workspace-mb"),
])
def test_bad_values_refused(args, env, needle):
    refused(train(*TINY, *args, env_extra=env), needle)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_amp_on_cpu_refused(amp):
    r = train(*TINY, "--device", "cpu", "--amp", amp)
    refused(r, f"--amp {amp}: mixed precision needs --device cuda")


def test_amp_off_on_cpu_trains():
    r = train(*TINY, "--device", "cpu", "--amp", "off", "--tf32", "off", "--deterministic",
              "--cudnn-workspace-mb", "64")
    assert r.returncode == 0 and "Epoch 0 finished" in r.stdout, r.stderr


def test_help_lists_the_device_flags():
    r = run([binary("cddp-train"), "--help"])
    assert r.returncode == 0
    for flag in ("--device D", "--amp P", "--tf32 S", "--cudnn-workspace-mb N", "--deterministic"):
        assert flag in r.stdout, flag
    assert "CDDP_DEVICE, else auto" in r.stdout


def test_checkpoint_carries_nothing_device_bound(tmp_path):
    ck = tmp_path / "run.ckpt"
    r = train(*TINY, "--device", "cpu", "--checkpoint", ck)
    assert r.returncode == 0, r.stderr
    raw = ck.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__")
    text = json.dumps(header) + json.dumps(meta)
    for word in ("cuda", "device", "nhwc", "amp."):
        assert word not in text.lower(), (word, meta)
    # and it resumes under auto (the CPU here, a GPU elsewhere: same format)
    r = train(*TINY, "--checkpoint", ck, "--epochs", "2")
    assert r.returncode == 0, r.stderr
    assert "=> resumed from checkpoint" in r.stdout


# --backend and --grad-reduce-dtype (DDP on GPUs, docs/gpu.md). The
# refusals come before anything connects, so one process with torchrun's
# environment for two ranks shows them; the GPU cases are tests/unit/
# test_device.c's and tools/gpu-check's.

def two_rank_env():
    return {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1"}


@pytest.mark.parametrize("args, needle", [
    (["--backend", "mpi"], "--backend: 'mpi' is not auto, gloo or nccl"),
    (["--backend", ""], "--backend: '' is not auto, gloo or nccl"),
    (["--grad-reduce-dtype", "fp16"], "--grad-reduce-dtype: 'fp16' is not fp32 or bf16"),
])
def test_bad_backend_values_refused(args, needle):
    refused(train(*TINY, *args), needle)


@pytest.mark.parametrize("device", [["--device", "cpu"], []])
@pytest.mark.parametrize("world", [1, 2])
def test_nccl_on_the_cpu_refused(device, world):
    if not device and gpu_visible():
        pytest.skip("a GPU is visible: auto would use it")
    env = two_rank_env() if world == 2 else {}
    r = train(*TINY, *device, "--backend", "nccl", env_extra=env)
    refused(r, "--backend nccl: NCCL reduces CUDA device memory, and this rank computes on the CPU")


@pytest.mark.parametrize("extra", [["--device", "cpu"], ["--device", "cpu", "--backend", "gloo"]])
def test_bf16_gradient_compression_on_the_cpu_refused(extra):
    r = train(*TINY, *extra, "--grad-reduce-dtype", "bf16", env_extra=two_rank_env())
    refused(r, "--grad-reduce-dtype bf16: gradient compression needs --device cuda and the nccl "
               "backend")


@no_gpu
def test_cuda_with_gloo_and_two_ranks_refused():
    r = train(*TINY, "--device", "cuda", "--backend", "gloo", env_extra=two_rank_env())
    why = "no CUDA device is visible" if has_cuda_build() else "built without CUDA"
    refused(r, "cddp-train: --device cuda:", why)


@pytest.mark.parametrize("backend", ["auto", "gloo"])
def test_two_cpu_ranks_use_gloo_and_say_so(tmp_path, backend):
    r = run([binary("cddprun"), "--nproc_per_node=2", "--standalone",
             f"--log_dir={tmp_path / 'logs'}", binary("cddp-train"), *TINY, "--threads", "1",
             "--steps", "1", "--backend", backend, "--grad-reduce-dtype", "fp32"],
            timeout=180, env=dict(os.environ, LOGLEVEL="INFO"))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [l for l in r.stderr.splitlines() if "T6201" in l]
    assert len(lines) == 2, r.stderr[-3000:]
    for l in lines:
        assert "DDP over 2 ranks (gloo):" in l, l
        assert f"gradients reduced in fp32 (--backend {backend}, host memory)" in l, l


def test_help_lists_the_ddp_device_flags():
    r = run([binary("cddp-train"), "--help"])
    assert r.returncode == 0
    for flag in ("--backend B", "--grad-reduce-dtype T"):
        assert flag in r.stdout, flag


# --cuda-graphs (docs/gpu.md, "CUDA graphs"): refused with one line, exit 2,
# wherever it cannot run; off the GPU that is always (the CUDA device is
# checked first). The GPU side is tools/gpu-check's graphs stage.
CPU_GRAPHS = "--cuda-graphs: CUDA graphs need --device cuda, and this rank computes on the CPU"


@pytest.mark.parametrize("world", [1, 2])
def test_cuda_graphs_on_the_cpu_refused(world):
    env = two_rank_env() if world == 2 else {}
    line = refused(train(*TINY, "--device", "cpu", "--cuda-graphs", env_extra=env), CPU_GRAPHS)
    assert line.endswith("(--device cpu)"), line
    # gloo between CPU ranks: the same refusal, before anything connects
    refused(train(*TINY, "--device", "cpu", "--backend", "gloo", "--cuda-graphs",
                  env_extra=two_rank_env()), CPU_GRAPHS)


@no_gpu
@pytest.mark.parametrize("extra", [[], ["--sync-bn"], ["--accum-steps", "2"]])
def test_cuda_graphs_with_auto_on_a_machine_without_a_gpu_refused(extra):
    why = "no CUDA device is visible" if has_cuda_build() else "built without CUDA"
    line = refused(train(*TINY, "--cuda-graphs", *extra), CPU_GRAPHS)
    assert why in line, line
    # several ranks: auto falls back to the CPU (gloo) and says why in the one line
    line = refused(train(*TINY, "--cuda-graphs", *extra, env_extra=two_rank_env()), CPU_GRAPHS)
    assert "T2001" not in line


def test_cuda_graphs_takes_no_value_and_is_in_help():
    r = train(*TINY, "--device", "cpu", "--cuda-graphs=yes")
    assert r.returncode == 2 and "--cuda-graphs" in r.stderr, r.stderr
    r = run([binary("cddp-train"), "--help"])
    assert r.returncode == 0 and "--cuda-graphs" in r.stdout
