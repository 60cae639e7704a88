"""cddprun with real worker processes: environment, restarts, failures and
the failure table, signals, process groups and the guardian, logs, tee and
filters, bad command lines.

Workers are small shell scripts (they start in a millisecond), written into
each test's tmp_path. Every wait is bounded; conftest fails any test that
leaves a process behind.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import binary, free_port, run, wait_for

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return p


def cddprun(*args, timeout=60, env=None, **kw):
    e = dict(os.environ)
    e.update(env or {})
    return run([binary("cddprun"), *args], timeout=timeout, env=e, **kw)


def read_env(path):
    out = {}
    for line in pathlib.Path(path).read_text().splitlines():
        k, _, v = line.partition("=")
        out[k] = v
    return out


def dump_env_worker(tmp_path):
    return script(tmp_path, "dump", f'env > "{tmp_path}/env.$LOCAL_RANK"\n')


# ---- environment ----

def test_worker_env(tmp_path):
    w = dump_env_worker(tmp_path)
    port = free_port()
    r = cddprun("--nproc_per_node=3", f"--master_port={port}", "--max_restarts=2",
                "--rdzv_id=job9", "--role=trainer", str(w), env={"OMP_NUM_THREADS": "4"})
    assert r.returncode == 0, r.stderr
    for lr in range(3):
        env = read_env(tmp_path / f"env.{lr}")
        want = {
            "LOCAL_RANK": str(lr), "RANK": str(lr), "GROUP_RANK": "0", "ROLE_RANK": str(lr),
            "ROLE_NAME": "trainer", "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "3",
            "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RUN_ID": "job9",
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            "OMP_NUM_THREADS": "4",
            "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        }
        for k, v in want.items():
            assert env.get(k) == v, (k, env.get(k))
        ef = env["TORCHELASTIC_ERROR_FILE"]
        assert re.search(rf"/torchelastic_[^/]+/job9_[^/]+/attempt_0/{lr}/error.json$", ef), ef
        assert env["CDDP_TEST_TAG"]  # the agent's environment is passed through
    assert "OMP_NUM_THREADS" not in r.stderr  # set by the user: no banner


def test_omp_num_threads_default(tmp_path):
    w = dump_env_worker(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    r = run([binary("cddprun"), "--nproc_per_node=2", f"--master_port={free_port()}", w],
            env=env)
    assert r.returncode == 0, r.stderr
    assert read_env(tmp_path / "env.1")["OMP_NUM_THREADS"] == "1"
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in r.stderr
    r = run([binary("cddprun"), "--nproc_per_node=1", f"--master_port={free_port()}", w],
            env=env)
    assert r.returncode == 0, r.stderr
    assert "OMP_NUM_THREADS" not in read_env(tmp_path / "env.0")
    assert "OMP_NUM_THREADS" not in r.stderr


def test_nccl_async_kept_and_endpoint_as_master(tmp_path):
    w = dump_env_worker(tmp_path)
    port = free_port()
    r = cddprun("--rdzv_endpoint", f"localhost:{port}", str(w),
                env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert r.returncode == 0, r.stderr
    env = read_env(tmp_path / "env.0")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("localhost", str(port))


def test_standalone(tmp_path):
    w = dump_env_worker(tmp_path)
    r = cddprun("--standalone", "--nproc_per_node=2", "--rdzv_id=ignored", str(w))
    assert r.returncode == 0, r.stderr
    e0, e1 = read_env(tmp_path / "env.0"), read_env(tmp_path / "env.1")
    assert UUID_RE.match(e0["TORCHELASTIC_RUN_ID"]), e0["TORCHELASTIC_RUN_ID"]
    assert e0["TORCHELASTIC_RUN_ID"] == e1["TORCHELASTIC_RUN_ID"]
    assert 0 < int(e0["MASTER_PORT"]) < 65536 and e0["MASTER_PORT"] == e1["MASTER_PORT"]
    assert e0["MASTER_ADDR"]
    r2 = cddprun("--standalone", "--local_addr=127.0.0.1", str(w))
    assert r2.returncode == 0, r2.stderr
    again = read_env(tmp_path / "env.0")
    assert again["TORCHELASTIC_RUN_ID"] != e0["TORCHELASTIC_RUN_ID"]
    assert again["MASTER_ADDR"] == "127.0.0.1"


def test_python_entrypoints(tmp_path):
    (tmp_path / "s.py").write_text(
        "import os, sys\n"
        "open(os.environ['OUT'] + '/py.' + os.environ['LOCAL_RANK'], 'w').write(\n"
        "    ' '.join([sys.executable] + open('/proc/self/cmdline').read().split('\\0')[1:-1]))\n")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(
        "import os, sys\nopen(os.environ['OUT'] + '/mod', 'w').write(' '.join(sys.argv[1:]))\n")
    env = {"OUT": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    r = cddprun("--nproc_per_node=2", str(tmp_path / "s.py"), "--lr", "0.1", env=env)
    assert r.returncode == 0, r.stderr
    line = (tmp_path / "py.1").read_text()
    assert line.endswith(f"-u {tmp_path / 's.py'} --lr 0.1"), line
    r = cddprun("-m", "pkg.mod", "a", "b", env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mod").read_text() == "a b"
    # --no_python runs a .py directly (its shebang decides)
    p = script(tmp_path, "direct.py", f'echo direct > "{tmp_path}/direct"\n')
    r = cddprun("--no_python", str(p))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "direct").read_text() == "direct\n"


def test_run_path_records_errors(tmp_path):
    (tmp_path / "boom.py").write_text("raise ValueError('run_path boom')\n")
    r = cddprun("--run_path", "--nproc_per_node=1", str(tmp_path / "boom.py"))
    assert r.returncode == 1
    assert "run_script_path FAILED" in r.stderr
    assert "ValueError: run_path boom" in r.stderr  # from error.json, not the console
    assert "error_file: <N/A>" not in r.stderr


# ---- success, failure, restarts ----

def test_exit_zero_and_fast(tmp_path):
    t = time.monotonic()
    r = cddprun("--nproc_per_node=4", "--no_python", "/bin/true")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("WARNING") <= 1  # only the OMP_NUM_THREADS notice, if any
    assert time.monotonic() - t < 30  # a bound, not a benchmark


def test_restart_counting(tmp_path):
    w = script(tmp_path, "w", f"""
echo "$TORCHELASTIC_RESTART_COUNT $LOCAL_RANK $$" >> "{tmp_path}/starts"
touch "{tmp_path}/up.$TORCHELASTIC_RESTART_COUNT.$LOCAL_RANK"
if [ "$TORCHELASTIC_RESTART_COUNT" -lt 2 ] && [ "$LOCAL_RANK" = 1 ]; then
    # fail only once rank 0 of this attempt is up, so both starts are recorded
    while [ ! -e "{tmp_path}/up.$TORCHELASTIC_RESTART_COUNT.0" ]; do sleep 0.01; done
    exit 7
fi
if [ "$TORCHELASTIC_RESTART_COUNT" -lt 2 ]; then exec sleep 30; fi
exit 0
""")
    logs = tmp_path / "logs"
    r = cddprun("--nproc_per_node=2", "--max_restarts=3", f"--log_dir={logs}", str(w))
    assert r.returncode == 0, r.stderr
    starts = [l.split() for l in (tmp_path / "starts").read_text().splitlines()]
    assert sorted((s[0], s[1]) for s in starts) == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    assert len({s[2] for s in starts}) == 6  # new processes every time
    assert r.stderr.count("Worker group FAILED") == 2
    assert "3/3 attempts left" in r.stderr and "2/3 attempts left" in r.stderr
    (run_dir,) = logs.iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["attempt_0", "attempt_1", "attempt_2"]


def test_max_restarts_exhausted_table(tmp_path):
    w = script(tmp_path, "w", f"""
echo x >> "{tmp_path}/starts.$LOCAL_RANK"
if [ "$LOCAL_RANK" = 1 ]; then exit 3; fi
exec sleep 30
""")
    r = cddprun("--nproc_per_node=2", "--max_restarts=1", str(w))
    assert r.returncode == 1
    assert len((tmp_path / "starts.1").read_text().split()) == 2  # two attempts
    err = r.stderr
    assert f"{w} FAILED" in err
    root = err.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root
    assert "exitcode  : 3 (pid: " in root
    assert "error_file: <N/A>" in root
    assert "traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html" in root
    failures = err.split("Failures:")[1].split("Root Cause")[0]
    # the peer stopped by the agent is listed as torch 2.x does
    assert "rank      : 0 (local_rank: 0)" in failures and "exitcode  : -15" in failures
    assert re.search(r"time      : \d{4}-\d\d-\d\d_\d\d:\d\d:\d\d", root)
    assert "failed (exitcode: 3) local_rank: 1" in err
    lines = err.splitlines()
    top = next(i for i, l in enumerate(lines) if l.endswith(" FAILED"))
    assert set(lines[top - 1]) == {"="} and len(lines[top - 1]) <= 60


def test_worker_killed_by_signal(tmp_path):
    w = script(tmp_path, "w", "kill -KILL $$\n")
    r = cddprun(str(w))
    assert r.returncode == 1
    m = re.search(r"exitcode  : -9 \(pid: (\d+)\)", r.stderr)
    assert m, r.stderr
    assert f"Signal 9 (SIGKILL) received by PID {m.group(1)}" in r.stderr


def test_error_json_and_agent_error_file(tmp_path):
    w = script(tmp_path, "w", """
cat > "$TORCHELASTIC_ERROR_FILE" <<EOF
{"message": {"message": "RuntimeError: from the worker", "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  File \\"t.py\\"\\nRuntimeError: from the worker\\n", "timestamp": "1700000000"}}}
EOF
exit 5
""")
    agent_file = tmp_path / "agent_error.json"
    r = cddprun(str(w), env={"TORCHELASTIC_ERROR_FILE": str(agent_file)})
    assert r.returncode == 1
    assert "traceback : Traceback (most recent call last):\n    File \"t.py\"\n  RuntimeError: from the worker" in r.stderr
    assert re.search(r"error_file: /.+/attempt_0/0/error.json", r.stderr)
    data = json.loads(agent_file.read_text())
    assert data["message"]["message"] == "RuntimeError: from the worker"
    assert data["message"]["errorCode"] == 5
    # the worker got its own path, not the agent's
    assert not (tmp_path / "w.err").exists()


def test_agent_error_file_without_worker_file(tmp_path):
    w = script(tmp_path, "w", "exit 4\n")
    agent_file = tmp_path / "agent_error.json"
    r = cddprun(str(w), env={"TORCHELASTIC_ERROR_FILE": str(agent_file)})
    assert r.returncode == 1
    msg = json.loads(agent_file.read_text())["message"]
    assert msg["errorCode"] == 4
    assert "exited with code 4" in msg["message"]
    assert "FAILED" in msg["extraInfo"]["py_callstack"]


def test_agent_failure_writes_agent_error_file(tmp_path):
    agent_file = tmp_path / "agent_error.json"
    r = cddprun("--log_dir=/proc/no/such/dir", "/bin/true",
                env={"TORCHELASTIC_ERROR_FILE": str(agent_file)})
    assert r.returncode == 1
    assert "/proc/no/such/dir" in r.stderr
    msg = json.loads(agent_file.read_text())["message"]
    assert msg["message"].startswith("AgentError: ") and "/proc/no/such/dir" in msg["message"]
    assert int(msg["extraInfo"]["timestamp"]) > 0


def test_exec_failure_is_a_worker_failure(tmp_path):
    p = tmp_path / "notexec"
    p.write_bytes(b"\x7fELF garbage")
    p.chmod(0o755)
    r = cddprun(str(p))
    assert r.returncode == 1
    assert "cannot execute" in r.stderr
    assert "exitcode  : 127" in r.stderr


def test_temp_log_dir_removed_only_after_plain_success(tmp_path):
    w = dump_env_worker(tmp_path)
    r = cddprun(str(w), env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("torchelastic_*"))
    f = script(tmp_path, "f", "exit 1\n")
    r = cddprun(str(f), env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 1
    assert len(list(tmp_path.glob("torchelastic_*"))) == 1  # the table points into it


# ---- stopping: process groups, grace, signals ----

def test_failure_stops_group_with_grandchildren(tmp_path):
    w = script(tmp_path, "w", f"""
if [ "$LOCAL_RANK" = 0 ]; then
    sh -c 'trap "" TERM; echo $$ > "{tmp_path}/gc"; exec sleep 60' &
    while [ ! -s "{tmp_path}/gc" ]; do sleep 0.01; done
    exit 2
fi
exec sleep 60
""")
    t = time.monotonic()
    r = cddprun("--nproc_per_node=2", str(w), env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "0.5"})
    assert r.returncode == 1
    assert time.monotonic() - t < 20
    gc = int((tmp_path / "gc").read_text())
    assert not pathlib.Path(f"/proc/{gc}").exists() or \
        open(f"/proc/{gc}/stat").read().split(")")[1].split()[0] == "Z"
    root = r.stderr.split("Root Cause")[1]
    assert "exitcode  : 2" in root


def test_stubborn_worker_gets_sigkill(tmp_path):
    w = script(tmp_path, "w", f"""
trap "" TERM
if [ "$LOCAL_RANK" = 1 ]; then
    while [ ! -e "{tmp_path}/ready" ]; do sleep 0.01; done
    exit 1
fi
touch "{tmp_path}/ready"
while :; do sleep 0.05; done
""")
    r = cddprun("--nproc_per_node=2", str(w), env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "0.3"})
    assert r.returncode == 1
    assert "forcefully exiting via SIGKILL" in r.stderr
    failures = r.stderr.split("Failures:")[1].split("Root Cause")[0]
    assert "exitcode  : -9" in failures


def test_success_stops_leftover_children(tmp_path):
    w = script(tmp_path, "w", f"""
sleep 60 &
echo $! > "{tmp_path}/bg.$LOCAL_RANK"
exit 0
""")
    t = time.monotonic()
    r = cddprun("--nproc_per_node=2", str(w))
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t < 20  # did not wait for sleep 60
    for lr in range(2):
        pid = int((tmp_path / f"bg.{lr}").read_text())
        assert not pathlib.Path(f"/proc/{pid}").exists()


def test_escaped_daemon_does_not_outlive_the_attempt(tmp_path):
    # a worker that starts a daemon in its own session: killpg cannot reach it
    w = script(tmp_path, "w", f"""
setsid sh -c 'echo $$ > "{tmp_path}/daemon"; exec sleep 300' &
while [ ! -s "{tmp_path}/daemon" ]; do sleep 0.01; done
exit 0
""")
    r = cddprun(str(w))
    assert r.returncode == 0, r.stderr
    pid = int((tmp_path / "daemon").read_text())
    assert f"killing process {pid}" in r.stderr
    wait_for(lambda: not pathlib.Path(f"/proc/{pid}").exists() or
             open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z",
             what="the escaped daemon to die")


def default_signals():
    """preexec_fn: cddprun starts as from a terminal's shell. A suite run in
    the background (`nohup`, `cmd &` in a script) ignores SIGHUP, SIGINT and
    SIGQUIT; cddprun passes that on to its workers as subprocess does, and a
    shell cannot trap a signal ignored at its start."""
    for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_DFL)


def signal_worker(tmp_path):
    return script(tmp_path, "w", f"""
for s in TERM INT HUP QUIT USR1; do trap "echo $s > '{tmp_path}/got.$LOCAL_RANK'; exit 0" $s; done
touch "{tmp_path}/ready.$LOCAL_RANK"
while :; do sleep 0.05; done
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_signal_forwarded_exit_128_plus(tmp_path, background, sig):
    w = signal_worker(tmp_path)
    p = background([binary("cddprun"), "--nproc_per_node=2", w], preexec_fn=default_signals)
    wait_for(lambda: all((tmp_path / f"ready.{i}").exists() for i in range(2)), what="workers")
    p.signal(sig)
    assert p.wait(timeout=30) == 128 + sig
    name = signal.Signals(sig).name
    for i in range(2):
        assert (tmp_path / f"got.{i}").read_text().strip() == name[3:]
    assert f"Received {name} death signal, shutting down workers" in p.err
    assert "FAILED" not in p.err  # a signal is not a failure: no table


def test_signals_to_handle_custom(tmp_path, background):
    w = signal_worker(tmp_path)
    p = background([binary("cddprun"), "--signals_to_handle=SIGUSR1", w],
                   preexec_fn=default_signals)
    wait_for(lambda: (tmp_path / "ready.0").exists(), what="worker")
    p.signal(signal.SIGUSR1)
    assert p.wait(timeout=30) == 128 + signal.SIGUSR1
    assert (tmp_path / "got.0").read_text().strip() == "USR1"


def test_second_signal_kills_at_once(tmp_path, background):
    w = script(tmp_path, "w", f"""
trap "touch '{tmp_path}/got_term'" TERM
trap "" INT
touch "{tmp_path}/ready"
while :; do sleep 0.05; done
""")
    p = background([binary("cddprun"), w], preexec_fn=default_signals,
                   env={**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60"})
    wait_for(lambda: (tmp_path / "ready").exists(), what="worker")
    p.signal(signal.SIGTERM)
    wait_for(lambda: (tmp_path / "got_term").exists(), what="the forwarded SIGTERM")
    t = time.monotonic()
    p.signal(signal.SIGINT)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    assert time.monotonic() - t < 15  # not the 60 s grace


def test_ignored_signals_inherited_like_subprocess(tmp_path):
    # `nohup`-style: cddprun starts with SIGHUP ignored (and SIGPIPE, which
    # Python's subprocess resets for its children, as cddprun does)
    w = script(tmp_path, "w", f'grep -E "^Sig(Ign|Cgt)" /proc/$$/status > "{tmp_path}/sig"\n')
    r = run(["/bin/sh", "-c", f"trap '' HUP PIPE; exec {binary('cddprun')} {w}"])
    assert r.returncode == 0, r.stderr
    ign = int((tmp_path / "sig").read_text().split()[1], 16)
    assert ign & (1 << (signal.SIGHUP - 1))
    assert not ign & (1 << (signal.SIGPIPE - 1))
    assert not ign & (1 << (signal.SIGTERM - 1))  # the agent's handlers are not inherited


def test_no_orphans_after_sigkill(tmp_path, background, no_orphans):
    w = script(tmp_path, "w", f"""
sleep 300 &
sh -c 'sleep 300 & wait' &
touch "{tmp_path}/ready.$LOCAL_RANK"
wait
""")
    p = background([binary("cddprun"), "--nproc_per_node=3", w])
    wait_for(lambda: all((tmp_path / f"ready.{i}").exists() for i in range(3)), what="workers")
    tag = no_orphans

    def tagged():
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
                st = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if st != "Z" and f"CDDP_TEST_TAG={tag}".encode() in env:
                out.append(int(d))
        return out

    # agent, guardian, 3 x (sh, sleep, sh, sleep); the inner sh forks its sleep
    # after the worker marked itself ready, so wait for the full count.
    wait_for(lambda: len(tagged()) >= 1 + 1 + 3 * 4, what="every worker and grandchild to start")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    wait_for(lambda: not tagged(), timeout=10, what="every worker and grandchild to die")


# ---- logs ----

def log_worker(tmp_path):
    return script(tmp_path, "w", """
echo "out of $LOCAL_RANK"
printf 'partial %s' "$LOCAL_RANK"
echo "err of $LOCAL_RANK" >&2
""")


def test_log_dir_layout_and_redirects(tmp_path):
    w = log_worker(tmp_path)
    logs = tmp_path / "logs"
    r = cddprun("--nproc_per_node=2", "--rdzv_id=run5", f"--log_dir={logs}", "-r", "3", str(w))
    assert r.returncode == 0, r.stderr
    (run_dir,) = logs.iterdir()
    assert re.fullmatch(r"run5_\w{6}", run_dir.name), run_dir.name
    for lr in range(2):
        d = run_dir / "attempt_0" / str(lr)
        assert (d / "stdout.log").read_text() == f"out of {lr}\npartial {lr}"
        assert (d / "stderr.log").read_text() == f"err of {lr}\n"
    assert "out of" not in r.stdout and "err of" not in r.stderr


def test_relative_log_dir_gives_absolute_paths(tmp_path):
    w = dump_env_worker(tmp_path)
    r = cddprun("--log_dir=rel/logs", str(w), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ef = read_env(tmp_path / "env.0")["TORCHELASTIC_ERROR_FILE"]
    assert ef.startswith(f"{tmp_path}/rel/logs/none_") and ef.endswith("/attempt_0/0/error.json")


def test_redirect_map(tmp_path):
    w = log_worker(tmp_path)
    logs = tmp_path / "logs"
    r = cddprun("--nproc_per_node=2", f"--log_dir={logs}", "--redirects=0:1,1:2", str(w))
    assert r.returncode == 0, r.stderr
    (run_dir,) = logs.iterdir()
    a = run_dir / "attempt_0"
    assert (a / "0" / "stdout.log").read_text().startswith("out of 0")
    assert not (a / "0" / "stderr.log").exists()
    assert (a / "1" / "stderr.log").read_text() == "err of 1\n"
    assert not (a / "1" / "stdout.log").exists()
    assert "out of 1" in r.stdout and "err of 0" in r.stderr
    assert "out of 0" not in r.stdout and "err of 1" not in r.stderr


def test_tee_prefixes(tmp_path):
    w = log_worker(tmp_path)
    logs = tmp_path / "logs"
    r = cddprun("--nproc_per_node=2", "--role=trainer", f"--log_dir={logs}", "--tee=3", str(w))
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    for lr in range(2):
        assert f"[trainer{lr}]:out of {lr}" in out
        assert f"[trainer{lr}]:partial {lr}" in out  # a last line without newline is kept
        assert f"[trainer{lr}]:err of {lr}" in r.stderr.splitlines()
    (run_dir,) = logs.iterdir()
    assert (run_dir / "attempt_0" / "1" / "stdout.log").read_text() == "out of 1\npartial 1"


def test_tee_template_and_filter(tmp_path):
    w = log_worker(tmp_path)
    logs = tmp_path / "logs"
    r = cddprun("--nproc_per_node=3", f"--log_dir={logs}", "-t", "1", "--local_ranks_filter=1,2",
                str(w), env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${rank}|${role_name}> "})
    assert r.returncode == 0, r.stderr
    assert "<1|default> out of 1" in r.stdout and "<2|default> out of 2" in r.stdout
    assert "out of 0" not in r.stdout  # filtered from the console
    assert "err of 0" not in r.stderr  # not teed, not shown: /dev/null
    assert "err of 1" in r.stderr and "<1|default> err" not in r.stderr  # stderr not teed
    (run_dir,) = logs.iterdir()
    assert (run_dir / "attempt_0" / "0" / "stdout.log").read_text().startswith("out of 0")


def test_log_dir_devnull(tmp_path):
    w = dump_env_worker(tmp_path)
    r = cddprun("--log_dir=/dev/null", "-r", "3", str(w))
    assert r.returncode == 0, r.stderr
    assert read_env(tmp_path / "env.0")["TORCHELASTIC_ERROR_FILE"] == ""


# ---- command line ----

@pytest.mark.parametrize("args,what", [
    (["--bogus", "w"], "--bogus"),
    (["--nnodes=x", "w"], "--nnodes"),
    (["--nnodes=2:1", "w"], "--nnodes"),
    (["--nproc_per_node=zero", "w"], "--nproc_per_node"),
    (["--max_restarts=-1", "w"], "--max_restarts"),
    (["--max-restarts", "x", "w"], "--max-restarts"),
    (["--tee=7", "w"], "--tee"),
    (["--rdzv_conf=a", "w"], "--rdzv_conf"),
    (["--signals_to_handle=SIGKILL", "w"], "SIGKILL"),
    ([], "training script"),
    (["/nonexistent/train.py"], "/nonexistent/train.py"),
    (["/nonexistent/worker"], "/nonexistent/worker"),
    (["--no_python", "-m", "x"], "--no_python"),
    (["--rdzv_backend=static", "--nnodes=1:4", "w"], "--nnodes=1:4"),
    (["--standalone", "--nnodes=2", "w"], "--standalone"),
    (["--rdzv_backend=c10d", "--rdzv_conf=join_timout=1", "w"], "join_timout"),
    (["--rdzv_backend=etcd", "w"], "etcd"),
    (["--numa_binding=everything", "w"], "--numa_binding"),
])
def test_bad_command_line(tmp_path, args, what):
    script(tmp_path, "w", "exit 0\n")
    r = cddprun(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert what in lines[0], lines[0]
    assert lines[0].startswith("cddprun: error: ")


def test_nproc_gpu_counts_visible_devices(tmp_path):
    w = dump_env_worker(tmp_path)
    gpus = pathlib.Path("/proc/driver/nvidia/gpus")
    present = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    r = cddprun("--nproc_per_node=gpu", str(w))
    if present == 0:
        assert r.returncode == 2 and "no CUDA device is visible" in r.stderr
        r = cddprun("--nproc_per_node=auto", str(w))  # falls back to the CPU count
        assert r.returncode == 0, r.stderr
        assert read_env(tmp_path / "env.0")["LOCAL_WORLD_SIZE"] == str(os.cpu_count())
    else:
        assert r.returncode == 0, r.stderr
        assert read_env(tmp_path / "env.0")["LOCAL_WORLD_SIZE"] == str(present)
        r = cddprun("--nproc_per_node=gpu", str(w), env={"CUDA_VISIBLE_DEVICES": ""})
        assert r.returncode == 2


def test_not_executable(tmp_path):
    p = tmp_path / "w"
    p.write_text("#!/bin/sh\n")
    r = cddprun(str(p))
    assert r.returncode == 2 and "not executable" in r.stderr


def test_bad_env_defaults(tmp_path):
    r = cddprun("/bin/true", env={"PET_NPROC_PER_NODE": "many"})
    assert r.returncode == 2 and "PET_NPROC_PER_NODE" in r.stderr
    r = cddprun("/bin/true", env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "x"})
    assert r.returncode == 2 and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in r.stderr


def test_pet_defaults_apply(tmp_path):
    w = dump_env_worker(tmp_path)
    r = cddprun(str(w), env={"PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "3"})
    assert r.returncode == 0, r.stderr
    env = read_env(tmp_path / "env.1")
    assert env["WORLD_SIZE"] == "2" and env["TORCHELASTIC_MAX_RESTARTS"] == "3"


def test_help_and_version():
    r = cddprun("--help")
    assert r.returncode == 0 and "--nproc-per-node" in r.stdout and "--signals-to-handle" in r.stdout
    r = cddprun("--version")
    assert r.returncode == 0 and r.stdout.startswith("cddprun ")


def test_loglevel_info_shows_config(tmp_path):
    r = cddprun("--no_python", "/bin/true", env={"LOGLEVEL": "INFO"})
    assert r.returncode == 0
    assert "Starting elastic_operator with launch configs" in r.stderr
    assert re.search(r"cddprun\[\d+\] .* INFO A\d{4}: ", r.stderr)
