"""The workers' Python (launcher/resolve.c) and the failure table's hint
when it has no torch (agent/report.c), with the cddprun of the build under
test (so this also runs under ASan):

  - PYTHON_EXEC, else the python3 of the environment cddprun is installed
    in (a real venv with this build's cddprun copied into its bin/, as pip
    puts it), else python3 on PATH; logged once (L0004);
  - PATH's first python3 is a real Python without torch (a venv that does
    not see Debian's packages), as a new user's pyenv or system Python:
    every way the agent can learn of the ModuleNotFoundError (by default,
    when it holds none of the worker's output; -r/--tee's stderr.log;
    --run_path's error file) adds one hint line naming that interpreter and
    PYTHON_EXEC; a failure that is something else adds none.

The wheel's own cddprun: tests/integration/test_wheel.py.
"""
import os
import re
import shutil
import subprocess

import pytest

from conftest import TORCH_PY, binary, free_port

HINT = re.compile(r"^hint: (\S+), the workers' Python, has no torch \(ModuleNotFoundError\); "
                  r"set PYTHON_EXEC to a Python that has PyTorch$", re.M)

WHO = r"""
import os, sys
try:
    import torch
    has = "torch"
except ModuleNotFoundError:
    has = "none"
os.write(1, f"WORKER {os.environ['RANK']} {sys.executable} {sys.prefix} {has}\n".encode())
"""


@pytest.fixture(scope="module")
def notorch(tmp_path_factory):
    """A directory whose python3 is a real Python 3 without torch (a venv
    that does not see the system's site-packages)."""
    d = tmp_path_factory.mktemp("notorch") / "venv"
    subprocess.run([TORCH_PY, "-m", "venv", "--without-pip", str(d)], check=True, timeout=120)
    r = subprocess.run([str(d / "bin" / "python3"), "-c", "import torch"], capture_output=True)
    assert r.returncode != 0 and b"No module named 'torch'" in r.stderr
    return d / "bin"


def env_without_python_exec(notorch, **extra):
    e = {k: v for k, v in os.environ.items() if k != "PYTHON_EXEC"}
    e["PATH"] = f"{notorch}:/usr/bin:/bin"
    e.update(extra)
    return e


def cddprun(args, env, exe=None, timeout=120):
    return subprocess.run([exe or binary("cddprun"), f"--master_port={free_port()}", *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=timeout)


def workers(out):
    return sorted(line.split()[1:] for line in out.splitlines() if line.startswith("WORKER "))


def test_python3_on_path_and_python_exec(tmp_path, notorch, torch_python):
    script = tmp_path / "who.py"
    script.write_text(WHO)
    r = cddprun(["--nproc_per_node=2", script], env_without_python_exec(notorch, LOGLEVEL="INFO"))
    assert r.returncode == 0, r.stderr
    py = str(notorch / "python3")
    assert [w[1:] for w in workers(r.stdout)] == [[py, str(notorch.parent), "none"]] * 2, r.stdout
    said = [line for line in r.stderr.splitlines() if "L0004" in line]
    assert len(said) == 1 and said[0].endswith(f"workers' Python: {py} (from python3 on PATH)"), \
        r.stderr
    # PYTHON_EXEC wins over PATH (and is what --run_path runs too)
    for how in ([], ["--run_path"]):
        r = cddprun(["--nproc_per_node=2", *how, script],
                    env_without_python_exec(notorch, LOGLEVEL="INFO", PYTHON_EXEC=torch_python))
        assert r.returncode == 0, r.stderr
        assert [w[1] for w in workers(r.stdout)] == [torch_python] * 2
        assert [w[3] for w in workers(r.stdout)] == ["torch"] * 2
        assert f"workers' Python: {torch_python} (from PYTHON_EXEC)" in r.stderr
    # a program is no Python worker: nothing said
    r = cddprun(["--nproc_per_node=1", "--no_python", "true"],
                env_without_python_exec(notorch, LOGLEVEL="INFO"))
    assert r.returncode == 0 and "L0004" not in r.stderr, r.stderr


def test_python3_of_the_environment_cddprun_is_in(tmp_path, notorch, torch_python):
    """cddprun in a venv's bin/ (pip's layout) runs the venv's python3, by
    its path, whatever PATH's first python3 is: the venv, made from
    Debian's Python with its site-packages, has torch."""
    env_dir = tmp_path / "env"
    subprocess.run([torch_python, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(env_dir)], check=True, timeout=120)
    exe = env_dir / "bin" / "cddprun"
    shutil.copy2(binary("cddprun"), exe)
    script = tmp_path / "who.py"
    script.write_text(WHO)
    r = cddprun(["--nproc_per_node=2", script], env_without_python_exec(notorch, LOGLEVEL="INFO"),
                exe=exe)
    assert r.returncode == 0, r.stderr
    py = str(env_dir / "bin" / "python3")
    # sys.executable is the venv's and sys.prefix the venv: Python found its
    # pyvenv.cfg, which it does only when started by that path
    assert workers(r.stdout) == [["0", py, str(env_dir), "torch"], ["1", py, str(env_dir), "torch"]]
    assert f"workers' Python: {py} (from the Python environment cddprun is installed in)" \
        in r.stderr
    # a bin/ that is no environment's: PATH again
    (env_dir / "pyvenv.cfg").unlink()
    r = cddprun(["--nproc_per_node=1", script], env_without_python_exec(notorch, LOGLEVEL="INFO"),
                exe=exe)
    assert r.returncode == 0, r.stderr
    assert "(from python3 on PATH)" in r.stderr and workers(r.stdout)[0][3] == "none"


@pytest.mark.parametrize("how", [[], ["--redirects=3"], ["--tee=3"], ["--run_path"],
                                 ["--log_dir=/dev/null"]],
                         ids=["inherited", "redirects", "tee", "run_path", "logs_devnull"])
def test_hint_when_the_workers_python_has_no_torch(tmp_path, notorch, how):
    """The issue's first run: ModuleNotFoundError tracebacks (shown, or in
    the logs) and a table that now says which Python ran and how to choose
    another."""
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    r = cddprun(["--nproc_per_node=4", *how, script], env_without_python_exec(notorch))
    assert r.returncode == 1, r.stderr
    hints = HINT.findall(r.stderr)
    assert hints == [str(notorch / "python3")], r.stderr
    # inside the table: the last line before its closing rule
    lines = r.stderr.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("hint: "))
    assert set(lines[i + 1]) == {"="} and "Root Cause" in "\n".join(lines[:i])
    if how in ([], ["--log_dir=/dev/null"]):
        # (the first failure stops the others, which may not have got that far)
        assert "ModuleNotFoundError: No module named 'torch'" in r.stderr


@pytest.mark.parametrize("how", [[], ["--redirects=3"]], ids=["inherited", "redirects"])
def test_no_hint_for_other_failures(tmp_path, notorch, torch_python, how):
    """No hint when torch is there, nor when the worker's tail shows another
    error, nor for an exit other than an uncaught exception's."""
    fail = tmp_path / "fail.py"
    fail.write_text("import sys\nsys.exit(1)\n")
    r = cddprun(["--nproc_per_node=2", *how, fail],
                env_without_python_exec(notorch, PYTHON_EXEC=torch_python))
    assert r.returncode == 1 and "FAILED" in r.stderr and "hint:" not in r.stderr, r.stderr
    other = tmp_path / "other.py"
    other.write_text("import nosuchmodule_xyz\n")
    r = cddprun(["--nproc_per_node=2", "--redirects=3", other], env_without_python_exec(notorch))
    assert r.returncode == 1 and "FAILED" in r.stderr and "hint:" not in r.stderr, r.stderr
    code2 = tmp_path / "code2.py"
    code2.write_text("import sys\nsys.exit(2)\n")
    r = cddprun(["--nproc_per_node=2", *how, code2], env_without_python_exec(notorch))
    assert r.returncode == 1 and "FAILED" in r.stderr and "hint:" not in r.stderr, r.stderr
