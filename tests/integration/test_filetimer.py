"""torch's file timer served by cddprun (TORCHELASTIC_ENABLE_FILE_TIMER=1,
docs/cli.md "torch's file timer"): workers use torch 1.13's own
FileTimerClient and `timer.expires(after=...)`. A worker that overruns is
killed with the timer's signal (SIGKILL, torch's default) and the group
restarts; one that finishes in time is left alone; malformed requests and
a pid that is not a worker are logged and ignored; the pipe is removed at
exit.
"""
import os
import re
import time

import pytest

from conftest import TORCH_PY, binary, free_port, run

pytestmark = pytest.mark.torch

WORKER = r"""
import os, sys, time
import torch.distributed.elastic.timer as timer
path = os.environ["TORCHELASTIC_TIMER_FILE"]
os.write(1, f"TIMER_FILE {path}\n".encode())
timer.configure(timer.FileTimerClient(path))
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
mode = os.environ.get("FT_MODE", "overrun")
if mode == "noise":
    # what the server must survive: garbage, a half line, a stranger's pid
    for junk in (b"garbage\n", b'{"pid": "x"}\n', b"\n", b'{"pid": 1, "scope_id": "init", '
                 b'"expiration_time": 1.0, "signal": 9}\n'):
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, junk)
        os.close(fd)
def blocked_step():
    time.sleep(60)
with timer.expires(after=1.0, scope="train_step"):
    if mode == "overrun" and attempt == 0:
        blocked_step()
    time.sleep(0.2)
time.sleep(1.5)  # past the released timer's expiry: nothing fires
os.write(1, f"DONE {attempt}\n".encode())
"""


def cddprun(tmp_path, env, *args, timeout=120):
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    e = dict(os.environ, PYTHON_EXEC=TORCH_PY, LOGLEVEL="INFO",
             TORCHELASTIC_ENABLE_FILE_TIMER="1")
    e.update(env)
    t0 = time.monotonic()
    r = run([binary("cddprun"), f"--master_port={free_port()}", *map(str, args), str(script)], env=e, timeout=timeout)
    return r, time.monotonic() - t0


def test_overrun_is_killed_and_the_group_restarts(tmp_path, torch_python):
    pipe = tmp_path / "timer.pipe"
    r, took = cddprun(tmp_path, {"TORCHELASTIC_TIMER_FILE": str(pipe)},
                      "--nproc_per_node=2", "--max_restarts=1")
    assert r.returncode == 0, r.stdout + r.stderr
    kills = [l for l in r.stderr.splitlines() if "A2409" in l]
    # both ranks overrun in attempt 0; the first killed fails the group,
    # whose stop may reach the other before its timer does
    assert 1 <= len(kills) <= 2, r.stderr
    assert all("scope 'train_step'" in l and "SIGKILL" in l for l in kills), kills
    assert "Worker group FAILED. 1/1 attempts left" in r.stderr, r.stderr
    assert sorted(re.findall(r"DONE (\d)", r.stdout)) == ["1", "1"], r.stdout
    assert r.stdout.count(f"TIMER_FILE {pipe}") >= 3
    assert f"A2410: [default] serving torch's file timer at TORCHELASTIC_TIMER_FILE={pipe}" \
        in r.stderr
    assert took < 60
    assert not pipe.exists()  # removed at exit


def test_in_time_left_alone_and_noise_ignored(tmp_path, torch_python):
    # No TORCHELASTIC_TIMER_FILE: the agent picks /tmp/watchdog_timer_<uuid4>
    # as torchrun does and tells the workers.
    r, _ = cddprun(tmp_path, {"FT_MODE": "noise"}, "--nproc_per_node=1", "--max_restarts=0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "A2409" not in r.stderr
    assert "DONE 0" in r.stdout
    m = re.search(r"TIMER_FILE (/tmp/watchdog_timer_[0-9a-f-]{36})\n", r.stdout)
    assert m, r.stdout
    assert not os.path.exists(m.group(1))
    bad = [l for l in r.stderr.splitlines() if "A2401" in l]
    assert len(bad) == 2, r.stderr  # the empty line is not a request
    assert any("not a JSON object" in l for l in bad), bad
    assert any('"pid" is missing or not an integer' in l for l in bad), bad
    stranger = [l for l in r.stderr.splitlines() if "A2403" in l]
    assert len(stranger) == 1 and "pid 1 " in stranger[0], r.stderr


def test_off_without_the_variable(tmp_path, torch_python):
    # TORCHELASTIC_ENABLE_FILE_TIMER unset: no server; torch's client
    # cannot open a pipe that is not there (BrokenPipeError in the worker).
    pipe = tmp_path / "timer.pipe"
    r, _ = cddprun(tmp_path, {"TORCHELASTIC_ENABLE_FILE_TIMER": "0",
                              "TORCHELASTIC_TIMER_FILE": str(pipe)},
                   "--nproc_per_node=1", "--max_restarts=0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "A2410" not in r.stderr
    assert "BrokenPipeError" in r.stderr or "BrokenPipeError" in r.stdout
    assert not pipe.exists()


def test_not_a_pipe_is_an_error(tmp_path, torch_python):
    f = tmp_path / "regular"
    f.write_text("keep me")
    r, _ = cddprun(tmp_path, {"TORCHELASTIC_TIMER_FILE": str(f)}, "--nproc_per_node=1")
    assert r.returncode == 1, r.stderr
    assert "A2407" in r.stderr and "is not a named pipe" in r.stderr, r.stderr
    assert f.read_text() == "keep me"
