"""The Python wheel (pyproject.toml, tools/wheel_backend.py): built from
this tree offline (python3 -m build --wheel --no-isolation, in a network
namespace with no network when one can be made), installed with
pip --no-index into a fresh venv that sees Debian's torch
(--system-site-packages), and used as a new user would, with a PATH whose
first python3 is a real Python without torch:

  - the wheel's name, tag (manylinux, the glibc its ELF files need), file
    list (the four programs, the cddp package, the libraries, nothing
    else), RECORD, and each ELF file's RUNPATH and needs;
  - the installed programs load no library from outside the venv but
    glibc's;
  - the seeds' DDP script through the venv's cddprun and through
    python -m cddp.run (workers on the venv's Python, without PYTHON_EXEC);
  - cddp.progress lines on /status, read with cddp.status(); report()
    outside cddprun and on a closed or stolen descriptor;
  - pip uninstall leaves the venv as it was.

heavy: the wheel is a release build of its own (about 1 to 2 minutes on 2
cores), and nothing here comes from the build under test, so it is not run
again under ASan (test_interpreter.py covers the C side there).
"""
import base64
import csv
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import time
import zipfile

import pytest

from conftest import ROOT, TORCH_PY, free_port, wait_for

pytestmark = pytest.mark.heavy

PROGRAMS = {"cddprun", "cddpctl", "cddp-rdzv", "cddp-train"}
PACKAGE = {"__init__.py", "_version.py", "progress.py", "py.typed", "run.py"}
GLIBC = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
         "libresolv.so.2", "ld-linux-x86-64.so.2", "linux-vdso.so.1"}


def offline():
    """A prefix that runs a command with no network (a new network
    namespace, loopback down), or [] where none can be made here."""
    if shutil.which("unshare") and subprocess.run(["unshare", "--net", "true"],
                                                  capture_output=True).returncode == 0:
        return ["unshare", "--net"]
    return []


def sh(args, timeout=600, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    for mod in ("build", "mesonpy"):
        if sh([TORCH_PY, "-c", f"import {mod}"]).returncode != 0:
            pytest.skip(f"python3 module {mod} missing (tools/setup.sh --test installs "
                        "python3-build and python3-mesonpy)")
    for tool in ("patchelf", "readelf", "strip", "ldd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (tools/setup.sh --test)")
    out = tmp_path_factory.mktemp("dist")
    t0 = time.monotonic()
    r = sh([*offline(), TORCH_PY, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, ROOT],
           timeout=1800, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    built = list(out.glob("*.whl"))
    assert len(built) == 1, built
    print(f"\nwheel built in {time.monotonic() - t0:.0f} s: {built[0].name}, "
          f"{built[0].stat().st_size / 2**20:.1f} MiB")
    return built[0]


def tree(root):
    """Every file, link and directory under root, relative."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def make_venv(path, pip=True):
    args = [TORCH_PY, "-m", "venv", "--system-site-packages", path]
    if not pip:
        args.insert(3, "--without-pip")
    r = sh(args, timeout=300)
    assert r.returncode == 0, r.stderr
    return path


def pip_install(venv, whl):
    r = sh([*offline(), venv / "bin" / "python", "-m", "pip", "install", "--no-index",
            "--disable-pip-version-check", whl], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="session")
def venv(wheel, tmp_path_factory):
    v = make_venv(tmp_path_factory.mktemp("venv") / "env")
    pip_install(v, wheel)
    return v


@pytest.fixture(scope="session")
def notorch(tmp_path_factory):
    """A bin/ whose python3 is a real Python without torch."""
    d = tmp_path_factory.mktemp("notorch") / "py"
    r = sh([TORCH_PY, "-m", "venv", "--without-pip", d], timeout=300)
    assert r.returncode == 0, r.stderr
    assert sh([d / "bin" / "python3", "-c", "import torch"]).returncode != 0
    return d / "bin"


def user_env(notorch, **extra):
    """A new user's environment: PATH's first python3 has no torch, no
    PYTHON_EXEC, the venv not activated."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHON_EXEC", "VIRTUAL_ENV")}
    e["PATH"] = f"{notorch}:/usr/bin:/bin"
    e.update(extra)
    return e


# ---- the wheel itself ----

def test_wheel_name_tag_and_files(wheel):
    m = re.fullmatch(r"cddp-(\d+\.\d+\.\d+)-py3-none-manylinux_2_(\d+)_x86_64\.whl", wheel.name)
    assert m, wheel.name
    version, glibc_minor = m.group(1), int(m.group(2))
    base = f"cddp-{version}"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = {i.filename: i for i in z.infolist()}
        wheel_meta = z.read(f"{base}.dist-info/WHEEL").decode()
        record = z.read(f"{base}.dist-info/RECORD").decode()
        meta = z.read(f"{base}.dist-info/METADATA").decode()
        data = {n: z.read(n) for n in names}
    assert f"Tag: py3-none-manylinux_2_{glibc_minor}_x86_64" in wheel_meta.splitlines()
    assert "Root-Is-Purelib: false" in wheel_meta
    assert "Name: cddp" in meta and f"Version: {version}" in meta
    assert f'__version__ = "{version}"' in data[f"{base}.data/purelib/cddp/_version.py"].decode()

    scripts = {n.split("/")[-1] for n in names if n.startswith(f"{base}.data/scripts/")}
    package = {n.split("/")[-1] for n in names if n.startswith(f"{base}.data/purelib/cddp/")}
    auto = f"{base}.data/data/lib/cddp/autoprogress/"
    libs = {n.split("/")[-1] for n in names
            if n.startswith(f"{base}.data/data/lib/cddp/") and not n.startswith(auto)}
    boot = auto + "sitecustomize.py"
    assert boot in names  # <prefix>/lib/cddp/autoprogress, beside the vendored libraries
    assert not any("/data/share/" in n for n in names), names  # pip would leave share/ behind
    assert scripts == PROGRAMS
    assert package == PACKAGE
    assert libs and all(re.fullmatch(r"lib[\w+.-]*\.so(\.\d+)*", x) for x in libs), libs
    assert not libs & GLIBC
    # nothing else: no man pages, docs, completion, systemd unit, headers, tests
    rest = [n for n in names if not n.startswith((f"{base}.data/scripts/",
                                                 f"{base}.data/purelib/cddp/",
                                                 f"{base}.data/data/lib/cddp/"))]
    assert all(n.startswith(f"{base}.dist-info/") for n in rest), rest
    assert {n.split("/", 1)[1] for n in rest if "/licenses/" not in n} == \
        {"METADATA", "WHEEL", "RECORD"}
    assert any(n.endswith("/licenses/libcurl4.copyright") for n in rest)
    for n in names:
        mode = info[n].external_attr >> 16
        lib = "/lib/cddp/" in n and not n.startswith(auto)
        want = 0o755 if "/scripts/" in n or lib else 0o644
        assert mode & 0o777 in (want, 0o664), (n, oct(mode))

    # RECORD: every file once, with its sha256 and size
    rows = list(csv.reader(io.StringIO(record)))
    assert sorted(r[0] for r in rows) == sorted(names)
    for path, digest, size in rows:
        if path.endswith("/RECORD"):
            assert digest == "" and size == ""
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(data[path]).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={want}" and int(size) == len(data[path]), path


def readelf(path, *flags):
    r = sh(["readelf", *flags, "--wide", path])
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_wheel_elf_files(wheel, tmp_path):
    """Each program's RUNPATH finds the libraries beside it once installed
    (dlopen by soname searches the caller's RUNPATH too), each library's
    finds its own; together they need nothing but glibc and each other; the
    tag's glibc is the newest any of them needs."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path)
    data = next(tmp_path.glob("cddp-*.data"))
    programs = [data / "scripts" / p for p in sorted(PROGRAMS)]
    libs = sorted(p for p in (data / "data" / "lib" / "cddp").iterdir() if p.is_file())
    carried = {p.name for p in libs}
    newest = (2, 17)
    needed_all = set()
    for f in programs + libs:
        dyn = readelf(f, "-d")
        runpath = re.findall(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", dyn)
        assert runpath == (["$ORIGIN/../lib/cddp"] if f in programs else ["$ORIGIN"]), (f, runpath)
        assert "(RPATH)" not in dyn, f
        needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dyn))
        assert needed <= GLIBC | carried, (f.name, needed - GLIBC - carried)
        needed_all |= needed
        for major, minor in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", readelf(f, "-V")):
            newest = max(newest, (int(major), int(minor)))
    # Carried but needed by no ELF file: what the programs only open on first
    # use (common/dl.h: libmicrohttpd; libcurl too, but cddpctl links it),
    # each named in a program; the probe that told the build so
    # (tools/dlopen_probe.c) is not shipped.
    dlopened = carried - needed_all
    assert {re.sub(r"\.so.*", "", x) for x in dlopened} == {"libmicrohttpd"}, dlopened
    assert any(x.startswith("libcurl.so.") for x in carried)  # cddpctl links it, cddprun opens it
    blobs = b"".join(p.read_bytes() for p in programs)
    assert all(x.encode() + b"\0" in blobs for x in dlopened), dlopened
    assert not (data / "scripts" / "dlopen-probe").exists()
    assert wheel.name.endswith(f"-manylinux_{newest[0]}_{newest[1]}_x86_64.whl"), (wheel.name,
                                                                                   newest)
    # the programs are stripped
    for f in programs:
        assert ".symtab" not in readelf(f, "-S"), f


# ---- installed ----

def test_installed_programs_load_only_their_libraries(venv, notorch):
    libdir = venv / "lib" / "cddp"
    for prog in sorted(PROGRAMS):
        exe = venv / "bin" / prog
        assert exe.is_file() and os.access(exe, os.X_OK)
        r = sh(["ldd", exe])
        assert r.returncode == 0 and "not found" not in r.stdout, r.stdout
        for line in r.stdout.splitlines():
            m = re.match(r"\s*(\S+) => (\S+)", line)
            if m and m.group(1) not in GLIBC:
                assert pathlib.Path(os.path.realpath(m.group(2))).parent == libdir, line
        r = sh([exe, "--version"], env=user_env(notorch, LD_LIBRARY_PATH=""))
        assert r.returncode == 0 and r.stdout.split()[0] == prog, (prog, r.stdout, r.stderr)


SEED = ROOT / "tests" / "compat" / "ddp_train.py"


def check_seed_run(r, out, python):
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = [line for line in r.stderr.splitlines() if "L0004" in line]
    assert len(said) == 1, r.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["world_size"] == 2 and result["env"]["TORCHELASTIC_RUN_ID"]
    assert result["losses"][-1] < result["losses"][0]
    assert (out / "checkpoint.pt").is_file()
    return said[0]


def test_seed_ddp_script_through_the_venvs_cddprun(venv, notorch, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = sh([venv / "bin" / "cddprun", "--nproc_per_node=2", f"--master_port={free_port()}", SEED,
            "--out", out], env=user_env(notorch, LOGLEVEL="INFO"))
    said = check_seed_run(r, out, venv / "bin" / "python3")
    assert said.endswith(f"workers' Python: {venv}/bin/python3 "
                         "(from the Python environment cddprun is installed in)"), said
    # The automatic progress' bootstrap, from the venv's share/ (pip's place).
    boot = (venv / "lib" / "cddp" / "autoprogress").resolve()
    assert f"L0005: automatic progress is on: " in r.stderr and f"({boot} first" in r.stderr, \
        r.stderr[-3000:]


def test_seed_ddp_script_through_python_m_cddp_run(venv, notorch, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = sh([venv / "bin" / "python", "-m", "cddp.run", "--nproc_per_node=2",
            f"--master_port={free_port()}", SEED, "--out", out],
           env=user_env(notorch, LOGLEVEL="INFO"))
    said = check_seed_run(r, out, venv / "bin" / "python")
    # the Python that ran the module, as python -m torch.distributed.run
    assert said.endswith(f"workers' Python: {venv}/bin/python (from PYTHON_EXEC)"), said
    # --help and a bad flag: cddprun's own answers through the module
    r = sh([venv / "bin" / "python", "-m", "cddp.run", "--help"], env=user_env(notorch))
    assert r.returncode == 0 and "--nproc_per_node" in r.stdout
    r = sh([venv / "bin" / "python", "-m", "cddp.run", "--nproc_per_node=x", "t.py"],
           env=user_env(notorch))
    assert r.returncode == 2 and r.stderr.startswith("cddprun: error:"), r.stderr


PROGRESS = r"""
import os, pathlib, sys, time
import torch
from cddp.progress import report
rank = int(os.environ["RANK"])
for step in range(5):
    report(step=step, loss=1.0 / (step + 1), epoch=0, samples_per_s=100.0 + rank, note="extra")
report(step=-1)                              # never sent: one warning
report(step=5, loss=float("nan"))
report(step=torch.tensor(6), loss=torch.tensor(0.25))  # tensors by .item()
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.05)
"""


def status(venv, port):
    r = sh([venv / "bin" / "python", "-c",
            f"import cddp, json; print(json.dumps(cddp.status('127.0.0.1:{port}')))"], timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else None


def test_progress_lines_on_status(venv, notorch, tmp_path, background):
    script = tmp_path / "progress.py"
    script.write_text(PROGRESS)
    go = tmp_path / "go"
    port = free_port()
    agent = background([venv / "bin" / "cddprun", "--nproc_per_node=2", f"--status_port={port}",
                        f"--master_port={free_port()}", script, go], env=user_env(notorch))

    def reported():
        doc = status(venv, port)
        if doc is None or agent.proc.poll() is not None:
            return agent.proc.poll() is not None and "exited"
        ws = doc.get("workers") or []
        done = len(ws) == 2 and all((w.get("progress") or {}).get("step") == 6 for w in ws)
        return done and doc

    doc = wait_for(reported, timeout=120, interval=0.2, what="both workers' step 6 on /status")
    assert doc != "exited", agent.proc.communicate()
    go.touch()
    assert agent.wait(timeout=60) == 0, agent.err
    assert doc["program"] == "cddprun" and doc["state"] == "running"
    for w in doc["workers"]:
        p = w["progress"]
        assert p["step"] == 6 and p["loss"] == 0.25 and p["epoch"] == 0, p
        assert p["samples_per_s"] == 100.0 + w["rank"], p
        assert p["lines"] == 7 and p["malformed"] == 0, p  # 5 + NaN + tensors; step=-1 never sent
    warnings = [line for line in agent.err.splitlines() if line.startswith("cddp.progress:")]
    assert len(warnings) == 2 and all("step=-1" in line for line in warnings), agent.err


def test_progress_report_never_raises(venv, notorch, tmp_path):
    py = venv / "bin" / "python"
    # outside cddprun: nothing at all
    r = sh([py, "-c", "from cddp.progress import report; report(step=1, loss=2.0); print('ok')"],
           env=user_env(notorch))
    assert r.returncode == 0 and r.stdout == "ok\n" and r.stderr == "", r.stderr
    r = sh([py, "-c", "from cddp.progress import report; report(step=1); report(step=2)"],
           env=user_env(notorch, CDDP_PROGRESS_FD="three"))
    assert r.returncode == 0 and r.stderr.count("cddp.progress:") == 1, r.stderr
    # importing it costs nothing: no module beyond the package's own
    r = sh([py, "-c", "import sys; before = set(sys.modules); import cddp.progress; "
                      "print(sorted(set(sys.modules) - before))"], env=user_env(notorch))
    assert r.returncode == 0 and json.loads(r.stdout.replace("'", '"')) == \
        ["cddp", "cddp._version", "cddp.progress"], r.stdout
    # under cddprun, the descriptor closed, or taken by a file: one warning,
    # nothing raised, the file untouched
    script = tmp_path / "closed.py"
    script.write_text(
        "import os, sys\n"
        "from cddp.progress import report\n"
        "fd = int(os.environ['CDDP_PROGRESS_FD'])\n"
        "if sys.argv[1] == 'closed':\n"
        "    os.close(fd)\n"
        "else:\n"
        "    f = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "    os.dup2(f, fd)\n"
        "for i in range(3):\n"
        "    report(step=i, loss=1.0)\n"
        "print('RANK', os.environ['RANK'], 'survived', flush=True)\n")
    victim = tmp_path / "victim"
    for how in ("closed", "stolen"):
        r = sh([venv / "bin" / "cddprun", "--nproc_per_node=1", f"--master_port={free_port()}",
                script, how, victim], env=user_env(notorch))
        assert r.returncode == 0 and "RANK 0 survived" in r.stdout, r.stderr
        assert r.stderr.count("cddp.progress:") == 1, r.stderr
    assert victim.read_bytes() == b""


def test_uninstall_leaves_nothing(wheel, tmp_path):
    v = make_venv(tmp_path / "env")
    before = tree(v)
    pip_install(v, wheel)
    added = tree(v) - before
    assert {f"bin/{p}" for p in PROGRAMS} <= added
    assert "lib/cddp" in added and any(a.endswith("site-packages/cddp/progress.py") for a in added)
    # the package imports, and finds its cddprun
    r = sh([v / "bin" / "python", "-c", "import cddp.run; print(cddp.run.cddprun_path())"])
    assert r.returncode == 0 and r.stdout.strip() == str(v / "bin" / "cddprun"), r.stderr
    r = sh([v / "bin" / "python", "-m", "pip", "uninstall", "-y", "--disable-pip-version-check",
            "cddp"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree(v) == before, sorted(tree(v) ^ before)


# ---- on a Debian 12 machine with none of our libraries ----

ROOT_PYTHON = r"""
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends python3-venv >/dev/null
# none of the libraries the programs link is on this machine
for p in libuv1 libcjson1 libcurl4 libmicrohttpd12 libdnnl2 libgloo0 libturbojpeg0 libgomp1; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
        echo "ROOT HAS $p"; exit 3
    fi
done
echo "ROOT READY"
"""

# With no network but loopback.
ROOT_SMOKE = r"""
python3 -m venv /opt/env
/opt/env/bin/pip install -q --no-index --disable-pip-version-check /tmp/whl/*.whl
cd /tmp
/opt/env/bin/cddprun --nproc_per_node=2 /bin/true
echo "SMOKE cddprun exit $?"
for p in cddprun cddpctl cddp-rdzv cddp-train; do /opt/env/bin/$p --version; done
cat >who.py <<'PY'
import os, sys
os.write(1, (" ".join(["WORKER", os.environ["RANK"], sys.executable]) + chr(10)).encode())
PY
LOGLEVEL=INFO /opt/env/bin/cddprun --nproc_per_node=2 who.py
/opt/env/bin/python -m cddp.run --nproc_per_node=1 who.py
/opt/env/bin/cddprun --nproc_per_node=2 /opt/env/bin/cddp-train --arch resnet18 --data synthetic \
    --image-size 32 --num-samples 16 --batch-size 4 --num-classes 10 --threads 1 --epochs 1
echo "SMOKE train exit $?"
# the etcd backend opens libcurl on first use: curl's own words mean it did
timeout 5 /opt/env/bin/cddprun --nnodes=1 --rdzv_backend=etcd-v2 --rdzv_endpoint=127.0.0.1:1 \
    --rdzv_id=x /bin/true >/tmp/etcd.out 2>&1 || true
grep -q "Couldn't connect to server" /tmp/etcd.out && echo "SMOKE etcd libcurl" || cat /tmp/etcd.out
/opt/env/bin/cddp-rdzv --port=0 --status-port=9400 2>/tmp/rdzv.err &
pid=$!
i=0
until /opt/env/bin/cddpctl health 127.0.0.1:9400 >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 300 ] || { cat /tmp/rdzv.err; exit 4; }; sleep 0.1
done
/opt/env/bin/python -c "import cddp; print('STATUS', cddp.status('127.0.0.1:9400')['program'])"
kill -TERM $pid
wait $pid && echo "SMOKE rdzv exit 0"
/opt/env/bin/pip uninstall -y -q cddp
ls /opt/env/bin /opt/env/lib
"""


def test_wheel_in_a_clean_debian_12_root(wheel, tmp_path):
    """pip install into a venv of a minbase Debian 12 root with only
    python3-venv added: no -dev package, none of the libraries the programs
    link. Every program starts; workers run on the venv's Python; cddp-train
    (oneDNN, gloo, OpenMP from the wheel) trains across two processes; the
    libraries opened on first use load (libcurl for the etcd backend,
    libmicrohttpd for a status port); a cddp-rdzv answers cddpctl and
    cddp.status; uninstall takes it all."""
    from test_deb import in_root, minbase_root, need_roots, save_root

    need_roots()
    # The root with python3-venv is cached (test_deb.save_root) once made;
    # ROOT_PYTHON runs on it all the same and checks what it holds.
    rootfs = minbase_root(tmp_path, layer="python3-venv")
    try:
        r = in_root(rootfs, ROOT_PYTHON, 900)
        assert r.returncode == 0 and "ROOT READY" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
        save_root(rootfs, "python3-venv")
        (rootfs / "tmp" / "whl").mkdir()
        shutil.copy(wheel, rootfs / "tmp" / "whl" / wheel.name)
        r = in_root(rootfs, ROOT_SMOKE, 900, net=True)
        out = r.stdout
        assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
        assert "SMOKE cddprun exit 0" in out and "SMOKE train exit 0" in out, out[-3000:]
        assert "SMOKE etcd libcurl" in out, out[-3000:]
        for p in sorted(PROGRAMS):
            assert re.search(rf"^{p} \d+\.\d+\.\d+", out, re.M), (p, out)
        workers = sorted(line for line in out.splitlines() if line.startswith("WORKER "))
        assert workers == ["WORKER 0 /opt/env/bin/python", "WORKER 0 /opt/env/bin/python3",
                           "WORKER 1 /opt/env/bin/python3"], out
        assert "STATUS cddp-rdzv" in out and "SMOKE rdzv exit 0" in out, out
        # uninstalled: the venv as python3 -m venv made it
        listing = out.split("SMOKE rdzv exit 0", 1)[1].split()
        assert not set(listing) & (PROGRAMS | {"cddp"}), listing
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
