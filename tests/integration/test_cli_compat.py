"""cddprun as the Kubeflow training operator and torchrun's newest command
line drive it, with real processes: the PET_* variables as the operator
sets them, quotes around --rdzv_conf that survived into argv,
--virtual-local-rank, --duplicate-*-filters, --shutdown-timeout,
--numa-binding, and how a --run_path worker ends (its exit code, that it
leaves through os._exit after the script's own atexit handlers, and that a
gloo group left without destroy_process_group does not abort at exit).
"""
import ctypes.util
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import TORCH_PY, binary, free_port, run
from test_launcher import read_env, script

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def cddprun(*args, timeout=60, env=None, clear_pet=True, **kw):
    """test_launcher's, but without the PET_ variables of the caller."""
    e = {k: v for k, v in os.environ.items() if not (clear_pet and k.startswith("PET_"))}
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(env or {})
    return run([binary("cddprun"), *args], timeout=timeout, env=e, **kw)


def dump_env_worker(tmp_path):
    return script(tmp_path, "dump", f'env > "{tmp_path}/env.$RANK"\n')


# ---- the training operator's PET_* variables ----

def test_kubeflow_elastic_pet_env(tmp_path):
    """What pkg/controller.v1/pytorch/elastic.go and envvar.go set for an
    elastic PyTorchJob: MIN:MAX nodes, the old PET_N_PROC_PER_NODE, c10d on
    worker 0, a run id, a quoted PET_RDZV_CONF, max restarts."""
    w = dump_env_worker(tmp_path)
    port = free_port()
    pet = {
        "PET_NNODES": "1:2",
        "PET_N_PROC_PER_NODE": "2",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "PET_RDZV_ID": "kfjob",
        "PET_RDZV_CONF": "'last_call_timeout=1,join_timeout=30'",
        "PET_MAX_RESTARTS": "3",
    }
    r = cddprun(str(w), env=pet, timeout=90)
    assert r.returncode == 0, r.stderr
    notes = [l for l in r.stderr.splitlines() if "L2001" in l]
    assert any("PET_N_PROC_PER_NODE=2 read as PET_NPROC_PER_NODE" in l for l in notes), r.stderr
    assert any("PET_RDZV_CONF: removed the quotes" in l for l in notes), r.stderr
    for rank in range(2):
        env = read_env(tmp_path / f"env.{rank}")
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["TORCHELASTIC_RUN_ID"] == "kfjob"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "3"


def test_kubeflow_standalone_empty(tmp_path):
    """PET_STANDALONE set to the empty string is the operator's "standalone
    on" (torch 1.13's torchrun dies on it); PET_NPROC_PER_NODE=auto with no
    GPU is the CPU count, as torchrun."""
    w = dump_env_worker(tmp_path)
    r = cddprun(str(w), env={"PET_STANDALONE": "", "PET_NPROC_PER_NODE": "auto",
                             "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    assert "PET_STANDALONE is set and empty: standalone on" in r.stderr
    n = os.cpu_count()
    for rank in range(n):
        env = read_env(tmp_path / f"env.{rank}")
        assert env["WORLD_SIZE"] == str(n)
        assert UUID_RE.match(env["TORCHELASTIC_RUN_ID"]), env["TORCHELASTIC_RUN_ID"]
    # Anything else that is not an integer is still refused, by name.
    r = cddprun(str(w), env={"PET_STANDALONE": "yes"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert "PET_STANDALONE" in r.stderr


def test_torchrun_113_dies_on_empty_pet_standalone(tmp_path):
    """The reason for the above: Debian's torchrun (1.13) on PET_STANDALONE=""."""
    w = dump_env_worker(tmp_path)
    torchrun = pathlib.Path(__file__).resolve().parent.parent / "compat" / "torchrun_py311.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env["PET_STANDALONE"] = ""
    r = run([TORCH_PY, str(torchrun), "--no_python", str(w)], env=env, timeout=120)
    assert r.returncode != 0
    assert "invalid literal for int()" in r.stderr


# ---- --rdzv_conf with the quotes inside the argument ----

@pytest.mark.parametrize("value", ["'join_timeout=5,timeout=5'", '"join_timeout=5,timeout=5"'])
def test_rdzv_conf_quotes_removed(tmp_path, value):
    w = dump_env_worker(tmp_path)
    r = cddprun("--standalone", f"--rdzv_conf={value}", str(w))
    assert r.returncode == 0, r.stderr
    assert re.search(r"WARNING L2001: --rdzv_conf: removed the quotes \(.\.\.\..\) around "
                     r"'join_timeout=5,timeout=5'", r.stderr), r.stderr


@pytest.mark.parametrize("value,named", [
    ("'join_timeout=5", "'join_timeout"),
    ("join_timeout='5'", "'5'"),
    ("'join_timeout=5\"", "'join_timeout"),
    ("'join_timeout'", "must have a value"),
])
def test_rdzv_conf_other_quotes_refused(tmp_path, value, named):
    w = dump_env_worker(tmp_path)
    r = cddprun("--standalone", f"--rdzv_conf={value}", str(w))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cddprun: error: "), r.stderr
    assert named in lines[0]


# ---- torchrun's newest flags ----

@pytest.mark.parametrize("spelling", ["--virtual-local-rank", "--virtual_local_rank"])
def test_virtual_local_rank(tmp_path, spelling):
    w = dump_env_worker(tmp_path)
    r = cddprun("--standalone", "--nproc-per-node=2", spelling, str(w),
                env={"CUDA_VISIBLE_DEVICES": "5, 7"})
    assert r.returncode == 0, r.stderr
    for rank, dev in ((0, "5"), (1, "7")):
        env = read_env(tmp_path / f"env.{rank}")
        assert env["LOCAL_RANK"] == "0"
        assert env["RANK"] == str(rank)
        assert env["CUDA_VISIBLE_DEVICES"] == dev
    # without it: the agent's list, and the real local rank
    r = cddprun("--standalone", "--nproc-per-node=2", str(w), env={"CUDA_VISIBLE_DEVICES": "5, 7"})
    assert r.returncode == 0, r.stderr
    env = read_env(tmp_path / "env.1")
    assert env["LOCAL_RANK"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "5, 7"
    # fewer devices than workers: one line, before anything starts
    r = cddprun("--standalone", "--nproc-per-node=3", spelling, str(w),
                env={"CUDA_VISIBLE_DEVICES": "5,7"})
    assert r.returncode == 2 and "CUDA_VISIBLE_DEVICES=5,7" in r.stderr


def test_duplicate_filters(tmp_path):
    w = script(tmp_path, "talk", 'echo "apple $RANK"; echo pear; echo "a,b $RANK"\n'
                                 'echo "NCCL WARN $RANK" >&2; echo quiet >&2\n')
    logs = tmp_path / "logs"
    r = cddprun("--standalone", "--nproc_per_node=2", "--tee=3", f"--log-dir={logs}",
                "--duplicate-stdout-filters", "apple,a,,b", str(w),
                env={"PET_DUPLICATE_STDERR_FILTERS": "NCCL WARN"})
    assert r.returncode == 0, r.stderr
    out = list(logs.glob("*/attempt_0/filtered_stdout.log"))
    err = list(logs.glob("*/attempt_0/filtered_stderr.log"))
    assert len(out) == 1 and len(err) == 1, list(logs.rglob("*"))
    got = sorted(out[0].read_text().splitlines())
    assert got == ["[default0]:a,b 0", "[default0]:apple 0", "[default1]:a,b 1",
                   "[default1]:apple 1"], got
    assert sorted(err[0].read_text().splitlines()) == ["[default0]:NCCL WARN 0",
                                                      "[default1]:NCCL WARN 1"]
    # the console and the per-rank files are unchanged
    assert "[default0]:pear" in r.stdout
    # no filters: no files
    logs2 = tmp_path / "logs2"
    r = cddprun("--standalone", "--tee=3", f"--log_dir={logs2}", str(w))
    assert r.returncode == 0
    assert not list(logs2.rglob("filtered_*"))


def test_shutdown_timeout_beats_the_variable(tmp_path):
    """Rank 1 ignores SIGTERM; when rank 0 fails the group is stopped, and
    SIGKILL follows --shutdown-timeout seconds later, not the 120 s the
    variable says."""
    w = script(tmp_path, "w", 'if [ "$RANK" = 0 ]; then sleep 0.5; exit 3; fi\n'
                              "trap '' TERM\nsleep 100 & wait; sleep 100\n")
    t0 = time.monotonic()
    r = cddprun("--standalone", "--nproc_per_node=2", "--shutdown-timeout=1", str(w),
                env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "120"}, timeout=90)
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert "exitcode  : 3" in r.stderr
    assert took < 60, took


def test_numa_binding_one_node(tmp_path):
    nodes = [p for p in pathlib.Path("/sys/devices/system/node").glob("node[0-9]*")]
    if len(nodes) != 1:
        pytest.skip(f"this machine has {len(nodes)} NUMA nodes (the one-node case is tested here; "
                    "the others in tests/unit/test_numa.c)")
    w = script(tmp_path, "w", f'grep Cpus_allowed_list /proc/self/status > "{tmp_path}/cpus.$RANK"\n')
    base = (tmp_path / "base")
    for mode in ("node", "socket", "exclusive", "core-complex"):
        r = cddprun("--standalone", "--nproc_per_node=2", f"--numa-binding={mode}", str(w))
        assert r.returncode == 0, r.stderr
        assert f"A2203: --numa_binding={mode}: this machine has one NUMA node" in r.stderr
        with open("/proc/self/status") as fh:
            mine = [l for l in fh if l.startswith("Cpus_allowed_list")][0].strip()
        assert (tmp_path / "cpus.1").read_text().strip() == mine
    r = cddprun("--standalone", "--numa_binding=nearby", str(w))
    assert r.returncode == 2 and "--numa_binding" in r.stderr


# ---- how a --run_path worker ends ----

RUN_PATH_CASES = [
    # (script body, exit code, text expected on stderr)
    ("print('last line, no newline', end='')\n", 0, None),
    ("import sys\nsys.exit(3)\n", 3, None),
    ("import sys\nsys.exit(None)\n", 0, None),
    ("import sys\nsys.exit('goodbye from the script')\n", 1, "goodbye from the script"),
    ("import sys\nsys.exit(True)\n", 1, None),
    ("import sys\nsys.exit(258)\n", 2, None),
    ("raise ValueError('boom')\n", 1, "ValueError: boom"),
]


@pytest.mark.parametrize("body,code,text", RUN_PATH_CASES)
def test_run_path_exit_codes(tmp_path, body, code, text):
    """Exit codes as multiprocessing's _bootstrap maps them (torchrun's
    worker), after the script's non-daemon threads and atexit handlers;
    then os._exit, so the C library's own exit handlers never run."""
    libc = ctypes.util.find_library("c")
    prologue = (
        "import atexit, ctypes, os, threading, time\n"
        f"d = {str(tmp_path)!r}\n"
        "def late():\n"
        "    time.sleep(0.3)\n"
        "    open(os.path.join(d, 'thread'), 'w').close()\n"
        "threading.Thread(target=late).start()\n"
        "atexit.register(lambda: open(os.path.join(d, 'atexit'), 'w').close())\n"
        f"libc = ctypes.CDLL({libc!r})\n"
        "CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)\n"
        "cb = CB(lambda status, arg: open(os.path.join(d, 'c_atexit'), 'w').close())\n"
        "libc.on_exit(cb, None)\n")
    s = tmp_path / "s.py"
    s.write_text(prologue + body)
    r = cddprun("--standalone", "--run_path", "--tee=3", f"--log_dir={tmp_path}/logs", str(s),
                env={"PYTHON_EXEC": TORCH_PY})
    if code == 0:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 1, r.stderr
        assert f"exitcode  : {code} " in r.stderr, r.stderr
    if text:
        assert text in r.stderr
    if "no newline" in body:
        assert "last line, no newline" in r.stdout
    assert (tmp_path / "thread").exists(), "non-daemon thread not joined"
    assert (tmp_path / "atexit").exists(), "atexit handlers not run"
    assert not (tmp_path / "c_atexit").exists(), "left through exit(), not os._exit"
    if "ValueError" in body:
        err = list((tmp_path / "logs").glob("*/attempt_0/0/error.json"))
        assert err, list((tmp_path / "logs").rglob("*"))
        msg = json.loads(err[0].read_text())["message"]
        assert msg["message"] == "ValueError: boom"
        assert "py_callstack" in msg["extraInfo"]


@pytest.mark.heavy
def test_run_path_gloo_tcp_init(tmp_path):
    """Issue 17's script: four ranks join gloo through tcp://, all-reduce
    and end without destroy_process_group. Every rank finishes and none
    aborts at exit (tests/bench/bench_run_path_soak.py counts how often
    over many runs, beside torchrun)."""
    script = pathlib.Path(__file__).resolve().parent.parent / "compat" / "gloo_tcp_init.py"
    r = cddprun("--standalone", "--nproc_per_node=4", "--run_path", str(script), timeout=300,
                env={"PYTHON_EXEC": TORCH_PY, "GLOO_SOCKET_IFNAME": "lo"}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "terminate called" not in r.stderr, r.stderr
    done = sorted(l for l in r.stdout.splitlines() if l.endswith(" done"))
    assert done == [f"rank {i} done" for i in range(4)], r.stdout


def test_run_path_keyboard_interrupt(tmp_path):
    s = tmp_path / "s.py"
    s.write_text("raise KeyboardInterrupt\n")
    r = cddprun("--standalone", "--run_path", str(s), env={"PYTHON_EXEC": TORCH_PY})
    assert r.returncode == 1
    assert "exitcode  : -2 " in r.stderr, r.stderr
