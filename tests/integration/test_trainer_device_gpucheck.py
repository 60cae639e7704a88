"""tools/gpu-check and its stage scripts on a machine without a GPU.

What can run here does: without a GPU, gpu-check exits 77 with one line
(whatever --stages says); bad arguments are one line, exit 2, before the GPU
is looked for; --help prints the stages. CDDP_GPU_CHECK_SELFTEST=1 runs the
stages' own code (the bundle or build lookup, the op checker's skip, the
parity and throughput scripts, the JSON and markdown reports) on the CPU
with small settings, so a mistake in them shows here and not in the few
minutes of a lent GPU. tests/gpu/parity.py and throughput.py refuse bad
arguments. --pack (heavy: it compresses the bundle) writes a bundle with
the binaries and the libraries they need, each binary with a RUNPATH of
$ORIGIN/../lib; unpacked into an empty folder and run in a mount namespace
where Debian's copies of those libraries are hidden, through the wrapper
and cddprun with the very environment gpu-check gives every process, each
binary still starts (and one without its RUNPATH does not: the hiding
works). --plan prints one device call per issue within the device tool's
limits. On a machine with a GPU the skip tests themselves skip.

The ddp stage (tests/gpu/ddp.py) in the self-test runs its whole
orchestration over gloo on the CPU: the one-GPU wrapper, cddp-collbench's
check, hang -> exit 75 -> restart -> resume, crash -> the other rank's exit
75 through the peer's failure, --sync-bn 2 x B = 1 x 2B (and plain BN not),
the torch DDP script under cddprun and torchrun with the same final loss,
the bandwidth of ours and torch's side by side, and the step-time table;
only the NCCL refusal skips. The wrapper and cddp-collbench's
--backend/--device refuse what they cannot do.
"""
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
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
                  "store", "--pack", "--plan", "single-gpu"):
        assert stage in r.stdout


def plan_of(r):
    line = next(l for l in r.stdout.splitlines() if l.startswith("plan: "))
    return json.loads(line[len("plan: "):])


def test_plan_is_one_call_per_issue_within_the_tools_limits():
    r = check("--plan")
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: a problem, e.g. no bundle yet
    plan = plan_of(r)
    calls = {c["set"]: c for c in plan["calls"]}
    assert set(calls) == {"single-gpu", "ddp", "compat"}, calls
    # The bundle of the build directory under test (build-asan/ under ASan),
    # named relative to the checkout as the device tool's carry wants it.
    bundle = os.path.relpath(os.path.join(BUILD, "gpu-bundle.tar.xz"), ROOT)
    prefix = "" if os.path.relpath(BUILD, ROOT) == "build" else \
        f"CDDP_BUILD_DIR={os.path.relpath(BUILD, ROOT)} "
    for c in calls.values():
        assert c["carry"] == [bundle]
        assert c["timeout_s"] <= 600 and len(c["command"]) <= 2000
        assert c["command"].startswith(prefix + "python3 tools/gpu-check --stages ")
        assert len(c["out_files"]) <= 8
        assert c["must_run_s"] <= c["budget_s"] < c["timeout_s"], c
        assert f"run(command={json.dumps(c['command'])}" in r.stdout
    assert calls["single-gpu"]["command"].endswith("--stages single-gpu")
    assert list(calls["single-gpu"]["bounds"]) == ["environment", "ops", "parity", "amp",
                                                   "throughput", "graphs", "store"]
    assert list(calls["ddp"]["bounds"]) == ["environment", "ddp"]
    assert list(calls["compat"]["bounds"]) == ["environment", "compat"]
    assert "torch-check.xml" in calls["compat"]["out_files"]
    bundle = BUILD / "gpu-bundle.tar.xz"
    assert (r.returncode == 1) == bool(plan["problems"])
    if not bundle.exists():
        assert any("--pack" in p for p in plan["problems"]), plan["problems"]
    # one issue's call alone
    r = check("--plan", "--stages", "ddp")
    assert [c["set"] for c in plan_of(r)["calls"]] == ["ddp"]


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
    r = check("--stages", "single-gpu,ddp",
              env_extra={"CDDP_GPU_CHECK_SELFTEST": "1", "OUT": str(out)}, timeout=1500)
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
    assert [c["check"] for c in ddp["checks"]] == [
        "allreduce", "hang-restart", "crash-async", "syncbn", "torch-ddp", "bandwidth",
        "step-time", "nccl-refusal"]  # the order of what the product promises
    assert {k: c["status"] for k, c in checks.items()} == {
        "allreduce": "ok", "hang-restart": "ok", "crash-async": "ok", "syncbn": "ok",
        "torch-ddp": "ok", "bandwidth": "ok", "step-time": "ok", "nccl-refusal": "skipped"}, checks
    hang = checks["hang-restart"]
    assert hang["waited_s"] <= hang["collective_timeout_s"] + 1
    assert 0 < hang["hang_to_restarted_first_step_s"] < 60, hang
    assert checks["crash-async"]["rc_rank0"] == 75
    assert checks["crash-async"]["crash_to_rank0_exit_s"] < 15
    assert checks["torch-ddp"]["final_loss_rel_diff"] <= 1e-5
    assert "all results right" in checks["allreduce"]["collbench_check"]
    rows = checks["bandwidth"]["rows"]
    assert [r["bytes"] for r in rows] == [4096 << i for i in range(5)], rows
    assert all(r["cddp_busbw_gbps"] > 0 and r["torch_busbw_gbps"] > 0 and r["ratio"] > 0
               for r in rows), rows
    assert [r["world"] for r in checks["step-time"]["rows"]] == [1, 1, 2, 2]
    # the ddp stage's own file, written as each check ended, the last time whole
    ddp_file = json.loads((out / "ddp.json").read_text())
    assert ddp_file["complete"] and ddp_file["checks"] == ddp["checks"]
    parity = next(s for s in report["stages"] if s["stage"] == "parity (resnet18)")["result"]
    assert parity["ok"] and parity["device"] == "cpu" and len(parity["losses"]["ours"]) == 3
    thr = json.loads((out / "throughput.json").read_text())
    assert thr["complete"]
    assert thr["modes"]["fp32"]["cddp"]["img_per_s"] > 0
    assert thr["modes"]["fp32"]["torch_eager"]["img_per_s"] > 0
    md = (out / "gpu-check.md").read_text()
    assert "## parity (resnet18)" in md and "| fp32 |" in md
    assert "## amp: --amp learns" in md and "| off | ok |" in md
    assert "## ddp: two ranks on one GPU" in md and "| hang-restart | ok |" in md
    # what the device tool brings back: at most 8 files, plain names, the log whole
    names = sorted(f.name for f in out.iterdir())
    assert names == ["ddp.json", "gpu-check.json", "gpu-check.log", "gpu-check.md",
                     "throughput.json"], names
    log = (out / "gpu-check.log").read_text()
    assert "gpu-check: ddp" in log and "report in" in log.splitlines()[-1]


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
    # the library path is the launcher's, whatever else the environment says
    r = run([wrap, "env"], timeout=30, env=dict(env, LOCAL_RANK="1", CDDP_ONE_GPU_NO_HOSTID="1",
                                                LD_LIBRARY_PATH="/cuda-libs",
                                                CDDP_ONE_GPU_LD_LIBRARY_PATH="/nowhere"))
    got = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l)
    assert "NCCL_HOSTID" not in got and got["LD_LIBRARY_PATH"] == "/cuda-libs"


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
    # the bundle's binaries find its libraries by RUNPATH, the libraries each other too
    dest = tmp_path / "bundle"
    unpack(bundle, dest)
    for b in (dest / "bin").iterdir():
        assert runpath(b)[0] == "$ORIGIN/../lib", (b, runpath(b))
    # (no libcurl: cddprun opens it for the etcd backend only, so ldd does
    # not list it and the bundle does not carry it)
    assert "libcurl.so.4" not in libs, libs
    for lib in ("libcjson.so.1", "libgloo.so.0", "libuv.so.1"):
        assert runpath(dest / "lib" / lib) == ["$ORIGIN"], lib


def unpack(bundle, dest):
    with tarfile.open(bundle) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # Python before 3.11.4
            tar.extractall(dest)


def runpath(path):
    r = run(["readelf", "-d", path], timeout=30)
    line = next((l for l in r.stdout.splitlines() if "(RUNPATH)" in l), "")
    return line.split("[", 1)[1].rstrip("]").split(":") if line else []


def gpu_check_module():
    """tools/gpu-check as a module: the environment its stages give."""
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(GPU_CHECK))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def debian_copies(sonames):
    """The files of Debian's copies of these libraries (ldconfig's cache)."""
    r = run(["ldconfig", "-p"], timeout=30)
    found = set()
    for line in r.stdout.splitlines():
        name = line.strip().split(" ", 1)[0]
        if name in sonames and "=>" in line and "x86-64" in line:
            found.add(os.path.realpath(line.split("=>")[1].strip()))
    return sorted(found)


@pytest.mark.heavy
def test_bundle_runs_without_debians_libraries(tmp_path):
    """Issue 23: the ddp stage's processes must find the bundle's libraries
    with Debian's copies out of reach, as on the GPU machine, in the very
    environment gpu-check gives every process (run_env: the CUDA library
    directories on LD_LIBRARY_PATH, never the bundle's), through the
    one-GPU wrapper and cddprun."""
    if not has_cuda_build():
        pytest.skip("no CUDA build: nothing to pack")
    if run(["unshare", "--mount", "true"], timeout=30).returncode != 0:
        pytest.skip("no mount namespace here (unshare --mount needs CAP_SYS_ADMIN)")
    bundle = BUILD / "gpu-bundle.tar.xz"
    newest = max(os.path.getmtime(BUILD / rel) for rel in
                 ("trainer/cddp-train", "launcher/cddprun", "trainer/cddp-collbench"))
    if not bundle.exists() or bundle.stat().st_mtime < newest:
        r = check("--pack", timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
    dest = tmp_path / "bundle"  # an empty folder
    unpack(bundle, dest)
    sonames = {p.name for p in (dest / "lib").iterdir()}
    hide = debian_copies(sonames)
    assert len(hide) >= 10, hide  # libcjson, libuv, libdnnl, libgloo, libcurl, libssl, ...
    gc = gpu_check_module()
    env = gc.run_env(["/nonexistent/cuda/lib"], LOCAL_RANK="1", LOGLEVEL="WARNING")
    assert str(dest / "lib") not in env["LD_LIBRARY_PATH"]
    # A copy of cddp-train without its RUNPATH: with the hiding working it cannot start.
    bare = tmp_path / "bare-cddp-train"
    shutil.copy2(dest / "bin" / "cddp-train", bare)
    assert run(["patchelf", "--remove-rpath", bare], timeout=30).returncode == 0
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    wrap = ROOT / "tests" / "gpu" / "one_gpu_rank.sh"
    b = dest / "bin"
    cmds = [
        [wrap, b / "cddp-train", "--help"],
        [wrap, b / "cddp-collbench", "--help"],
        [wrap, b / "cuda-opcheck", "--help"],  # (usage: exit 2, after loading)
        [wrap, b / "cddp-tcpstore", "--help"],
        [b / "cddprun", "--nproc_per_node=1", "--standalone", "--no-python", wrap,
         b / "cddp-train", "--help"],
        [wrap, bare, "--help"],
    ]
    script = "set -u\n" + "".join(f"mount --bind {empty} '{f}' || exit 3\n" for f in hide)
    for i, c in enumerate(cmds):
        script += (" ".join(f"'{a}'" for a in c) + f" >{tmp_path}/out{i} 2>&1; "
                   f"echo $? >{tmp_path}/rc{i}\n")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    for i, c in enumerate(cmds):
        out = (tmp_path / f"out{i}").read_text(errors="replace")
        rc = int((tmp_path / f"rc{i}").read_text())
        what = " ".join(str(a) for a in c[1:3])
        if c[1] == bare:
            assert "error while loading shared libraries" in out, out  # the control
            continue
        assert "error while loading shared libraries" not in out, (what, out)
        assert rc in (0, 2), (what, rc, out)


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
