"""tools/gpu-check and its stage scripts on a machine without a GPU.

What can run here does: without a GPU, gpu-check exits 77 with one line
(whatever --stages says); bad arguments are one line, exit 2, before the GPU
is looked for; --help prints the stages. CDDP_GPU_CHECK_SELFTEST=1 runs the
stages' own code (the bundle or build lookup, the op checker's skip, the
parity and throughput scripts, the JSON and markdown reports) on the CPU
with small settings, so a mistake in them shows here and not in the few
minutes of a lent GPU. tests/gpu/parity.py and throughput.py refuse bad
arguments. --pack (heavy: it compresses the bundle) writes a bundle with
the binaries and the libraries they need. On a machine with a GPU the
skip tests themselves skip.

The ddp stage (tests/gpu/ddp.py) in the self-test runs its whole
orchestration over gloo on the CPU: the one-GPU wrapper, cddp-collbench's
check and bench, hang -> exit 75 -> restart -> resume, crash -> the other
rank's exit 75 through the peer's failure, --sync-bn 2 x B = 1 x 2B (and
plain BN not), the torch DDP script under cddprun and torchrun with the same
final loss, and the step-time table; only the NCCL refusal skips. The
wrapper and cddp-collbench's --backend/--device refuse what they cannot do.
"""
import json
import os
import shutil
import tarfile

import pytest

from conftest import BUILD, ROOT, TORCH_PY, binary, run

GPU_CHECK = ROOT / "tools" / "gpu-check"


def has_cuda_build():
    cfg = BUILD / "config.h"
    return cfg.exists() and "#define CDDP_HAVE_CUDA 1" in cfg.read_text()


def gpu_visible():
    return shutil.which("nvidia-smi") and run(["nvidia-smi", "-L"], timeout=30).returncode == 0


def check(*args, env_extra=None, timeout=120):
    env = dict(os.environ, CDDP_BUILD_DIR=str(BUILD))
    env.pop("CDDP_GPU_CHECK_SELFTEST", None)
    env.update(env_extra or {})
    return run([TORCH_PY, GPU_CHECK, *args], timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.skipif(bool(gpu_visible()), reason="a GPU is visible")
@pytest.mark.parametrize("args", [[], ["--stages", "parity"], ["--stages=ops,throughput"]])
def test_no_gpu_exits_77_with_one_line(args):
    r = check(*args)
    assert r.returncode == 77, (r.stdout, r.stderr)
    lines = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpu-check: skipped: no NVIDIA GPU visible"), lines


@pytest.mark.parametrize("args, needle", [
    (["--stages", "bogus"], "--stages: 'bogus'"),
    (["--stages", ""], "--stages: ''"),
    (["--stages"], "unexpected argument '--stages'"),
    (["--pack", "now"], "unexpected argument '--pack'"),
    (["--frobnicate"], "unexpected argument '--frobnicate'"),
])
def test_bad_arguments(args, needle):
    r = check(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert r.stdout == ""


def test_help():
    r = check("--help")
    assert r.returncode == 0
    for stage in ("environment", "build", "ops", "parity", "amp", "ddp", "graphs", "throughput",
                  "--pack"):
        assert stage in r.stdout


@pytest.mark.parametrize("script, args, needle", [
    ("parity.py", ["--device", "tpu"], "--device"),
    ("parity.py", [], "--train"),
    ("throughput.py", ["--train", "x", "--modes", "fp64"], "--modes"),
    ("throughput.py", ["--train", "x", "--batch", "1"], "--batch"),
    ("amp.py", ["--train", "x", "--modes", "fp64"], "--modes"),
    ("amp.py", ["--train", "x", "--device", "cpu", "--modes", "bf16"], "--modes off only"),
    ("amp.py", ["--train", "x", "--samples", "8", "--batch", "8"], "8 steps at least"),
    ("ddp.py", ["--train", "x"], "--cddprun"),
    ("ddp.py", ["--train", "x", "--cddprun", "y", "--checks", "bogus"], "--checks"),
    ("ddp.py", ["--train", "x", "--cddprun", "y", "--device", "tpu"], "--device"),
    ("graphs.py", ["--train", "x", "--batch", "1"], "--batch"),
    ("graphs.py", [], "--train"),
])
def test_stage_scripts_refuse_bad_arguments(script, args, needle):
    r = run([TORCH_PY, ROOT / "tests" / "gpu" / script, *args], timeout=60)
    assert r.returncode == 2 and needle in r.stderr, (r.stdout, r.stderr)


@pytest.mark.torch
@pytest.mark.heavy
def test_selftest_runs_every_stage_on_the_cpu(torch_python, tmp_path):
    if not has_cuda_build():
        pytest.skip("no CUDA build: no cuda-opcheck to look for")
    binary("cddp-train")
    out = tmp_path / "out"
    out.mkdir()
    r = check(env_extra={"CDDP_GPU_CHECK_SELFTEST": "1", "OUT": str(out)}, timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "gpu-check.json").read_text())
    status = {s["stage"]: s["status"] for s in report["stages"]}
    assert status["environment"] == "ok" and status["build"] == "ok", status
    assert status["ops (fp32)"] == "skipped"  # the op checker's 77: no device
    assert status["parity (resnet18)"] == "ok", status
    assert status["ops (bf16)"] == "skipped" and status["amp"] == "ok", status
    amp = next(s for s in report["stages"] if s["stage"] == "amp")["result"]
    assert [r["mode"] for r in amp["runs"]] == ["off"] and amp["runs"][0]["ok"], amp
    assert amp["runs"][0]["last_loss"] < amp["runs"][0]["first_loss"], amp
    assert status["throughput (resnet152)"] == "ok", status
    assert status["ddp"] == "ok", status
    assert status["graphs"] == "ok", status  # on the CPU: the refusal, and the comparison code
    ddp = next(s for s in report["stages"] if s["stage"] == "ddp")["result"]
    checks = {c["check"]: c for c in ddp["checks"]}
    assert {k: c["status"] for k, c in checks.items()} == {
        "nccl-refusal": "skipped", "nccl-setup": "ok", "allreduce": "ok", "hang-restart": "ok",
        "crash-async": "ok", "syncbn": "ok", "torch-ddp": "ok", "step-time": "ok"}, checks
    hang = checks["hang-restart"]
    assert hang["waited_s"] <= hang["collective_timeout_s"] + 1
    assert 0 < hang["hang_to_restarted_first_step_s"] < 60, hang
    assert checks["crash-async"]["rc_rank0"] == 75
    assert checks["crash-async"]["crash_to_rank0_exit_s"] < 15
    assert checks["torch-ddp"]["final_loss_rel_diff"] <= 1e-5
    assert len(checks["allreduce"]["bench"]) == 5
    assert [r["world"] for r in checks["step-time"]["rows"]] == [1, 1, 2, 2]
    parity = json.loads((out / "parity-resnet18.json").read_text())
    assert parity["ok"] and parity["device"] == "cpu" and len(parity["losses"]["ours"]) == 3
    thr = json.loads((out / "throughput-resnet152.json").read_text())
    assert thr["modes"]["fp32"]["cddp"]["img_per_s"] > 0
    assert thr["modes"]["fp32"]["torch_eager"]["img_per_s"] > 0
    md = (out / "gpu-check.md").read_text()
    assert "## parity (resnet18)" in md and "| fp32 |" in md
    assert "## amp: --amp learns" in md and "| off | ok |" in md
    assert "## ddp: two ranks on one GPU" in md and "| hang-restart | ok |" in md
    # every file the device tool is to bring back has a plain name
    for f in out.iterdir():
        assert all(c.isalnum() or c in "-_." for c in f.name), f.name


def test_one_gpu_wrapper(tmp_path):
    wrap = ROOT / "tests" / "gpu" / "one_gpu_rank.sh"
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    r = run([wrap, "env"], timeout=30, env=env)
    assert r.returncode == 2 and "LOCAL_RANK is not set" in r.stderr, r.stderr
    r = run([wrap], timeout=30, env=dict(env, LOCAL_RANK="1"))
    assert r.returncode == 2 and "usage" in r.stderr
    r = run([wrap, "env"], timeout=30, env=dict(env, LOCAL_RANK="1"))
    got = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l)
    assert r.returncode == 0
    assert got["NCCL_HOSTID"] == "cddp-1" and got["CDDP_ONE_GPU_LOCAL_RANK"] == "1"
    assert got["LOCAL_RANK"] == "0" and got["CUDA_VISIBLE_DEVICES"] == "0"
    r = run([wrap, "env"], timeout=30, env=dict(env, LOCAL_RANK="1", CDDP_ONE_GPU_NO_HOSTID="1",
                                                CDDP_ONE_GPU_LD_LIBRARY_PATH="/nowhere"))
    got = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l)
    assert "NCCL_HOSTID" not in got and got["LD_LIBRARY_PATH"] == "/nowhere"


@pytest.mark.parametrize("args, needle", [
    (["--backend", "mpi"], "--backend: 'mpi' is not gloo or nccl"),
    (["--device", "tpu"], "--device: 'tpu' is not cpu or cuda"),
    (["--device", "cuda"], "--device cuda needs --backend nccl"),
])
def test_collbench_refuses_device_arguments(args, needle):
    r = run([binary("cddp-collbench"), *args], timeout=30)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_collbench_nccl_without_nccl_is_one_line():
    cfg = (BUILD / "config.h").read_text()
    if "#define CDDP_HAVE_NCCL 1" in cfg:
        pytest.skip("this build has NCCL")
    r = run([binary("cddp-collbench"), "--backend", "nccl", "--device", "cuda"], timeout=30)
    assert r.returncode == 2 and "built without NCCL" in r.stderr, r.stderr


@pytest.mark.heavy
def test_pack_bundles_both_binaries(tmp_path):
    if not has_cuda_build():
        pytest.skip("no CUDA build: nothing to pack")
    r = check("--pack", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    bundle = BUILD / "gpu-bundle.tar.xz"
    assert bundle.stat().st_size < 48 << 20, "the bundle must leave room in 64 MiB carried"
    with tarfile.open(bundle) as tar:
        names = set(tar.getnames())
    assert {"bin/cddp-train", "bin/cuda-opcheck", "bin/cddprun", "bin/cddp-collbench"} <= names, \
        names
    libs = {n.split("/")[-1] for n in names if n.startswith("lib/")}
    assert "libdnnl.so.2" in libs and "libgloo.so.0" in libs, libs
    assert not any(l.startswith(("libcudnn", "libcublas", "libc.so", "libnccl", "libresolv"))
                   for l in libs), libs


@pytest.mark.torch
def test_ddp_checks_skip_when_the_trainer_refuses(torch_python, tmp_path):
    """A cddp-train that refuses the device or communicator (a build without
    NCCL, say) makes its checks skipped with its words, not failed."""
    fake = tmp_path / "cddp-train"
    fake.write_text(f"#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --help ] && exec {binary('cddp-train')} "
                    "--help; done\necho 'cddp-train: --device cuda: 2 ranks: DDP between GPUs needs "
                    "the NCCL communicator, which this build does not have' >&2\nexit 2\n")
    fake.chmod(0o755)
    out = tmp_path / "ddp.json"
    r = run([TORCH_PY, ROOT / "tests" / "gpu" / "ddp.py", "--train", fake, "--cddprun",
             binary("cddprun"), "--device", "cpu", "--checks", "syncbn,hang-restart,crash-async,step-time",
             "--json", out], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {c["check"]: c for c in json.loads(out.read_text())["checks"]}
    assert [c["status"] for c in checks.values()] == ["skipped"] * 4, checks
    assert all("does not have" in c["reason"] for c in checks.values()), checks
