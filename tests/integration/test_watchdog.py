"""The progress watchdog end to end (docs/cli.md, "Progress watchdog"):
real cddprun runs with real workers (tests/helpers/hang_worker.c and a
Python script) that report progress on CDDP_PROGRESS_FD and then block.
A hung worker is found within the timeout + 1 s, the group is restarted
(counting against --max_restarts) and the second attempt completes; `auto`
learns from steady steps; slow but steady steps are never killed; with the
watchdog off nothing changes.
"""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from conftest import binary, free_port, run

# cddprun's exit codes (docs/cli.md, "Exit codes")
EXIT_HUNG = 3
EXIT_NO_PROGRESS = 4

PY_WORKER = """
import json, os, sys, time
fd = int(os.environ.get("CDDP_PROGRESS_FD", "-1"))
steps = int(os.environ.get("HANG_STEPS", "5"))
period = int(os.environ.get("HANG_PERIOD_MS", "200")) / 1000
def report(**v):
    fd >= 0 and os.write(fd, (json.dumps(v) + "\\n").encode())
def hang_in_python():
    while True:
        time.sleep(1)
def child_blocked():
    while True:
        time.sleep(1)
for i in range(steps):
    time.sleep(period)
    report(step=i)
if os.environ["TORCHELASTIC_RESTART_COUNT"] in os.environ.get("HANG_ATTEMPTS", "0").split(","):
    if os.environ.get("HANG_FORK") and os.fork() == 0:
        child_blocked()  # a dataloader-like child in the worker's group
    hang_in_python()
"""


def cddprun(args, env_extra, timeout=60):
    env = dict(os.environ)
    env.update(env_extra)
    t0 = time.monotonic()
    r = run([binary("cddprun"), *args], timeout=timeout, env=env)
    return r, time.monotonic() - t0


def hung_lines(stderr):
    return [l for l in stderr.splitlines() if "A0901" in l]


def silence(line):
    return float(re.search(r"no progress for ([0-9.]+) s", line).group(1))


def test_c_worker_hang_detected_and_restarted(tmp_path):
    errfile = tmp_path / "agent_error.json"
    r, took = cddprun(
        ["--nproc_per_node=2", "--max_restarts=1", "--watchdog_timeout=1",
         "--log_dir", tmp_path / "logs", binary("cddp-hang-worker")],
        {"HANG_STEPS": "3", "HANG_PERIOD_MS": "100", "HANG_ATTEMPTS": "0",
         "TORCHELASTIC_ERROR_FILE": str(errfile), "LOGLEVEL": "INFO"})
    assert r.returncode == 0, r.stderr
    lines = hung_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert 1.0 <= silence(lines[0]) < 2.0, lines[0]
    assert "after step 2" in lines[0] and "timeout 1.0 s, fixed" in lines[0]
    assert "Worker group FAILED. 1/1 attempts left" in r.stderr
    assert "attempt 1" in r.stderr
    assert not errfile.exists()  # the run succeeded
    assert took < 15
    # What the hung worker was doing, next to its logs: /proc, then gdb's
    # backtrace, which names the function it blocks in.
    stacks = list((tmp_path / "logs").glob("*/attempt_0/*/stacks.txt"))
    assert len(stacks) == 1, stacks
    text = stacks[0].read_text()
    assert "state S" in text or "state=S" in text, text
    if shutil.which("gdb"):
        assert "hang_here" in text, text


def test_python_worker_hang_out_of_restarts(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(PY_WORKER)
    errfile = tmp_path / "agent_error.json"
    r, _ = cddprun(
        ["--nproc_per_node=1", "--max_restarts=1", "--watchdog_timeout=1", script],
        {"HANG_STEPS": "3", "HANG_PERIOD_MS": "100", "HANG_ATTEMPTS": "0,1",
         "TORCHELASTIC_ERROR_FILE": str(errfile)})
    assert r.returncode == EXIT_HUNG, r.stderr  # hung past its restarts
    assert 'exit code: 3 (hung; docs/cli.md' in r.stderr, r.stderr  # in the failure table
    lines = hung_lines(r.stderr)
    assert len(lines) == 2, r.stderr
    for l in lines:
        assert 1.0 <= silence(l) < 2.0, l
    # the failure table and the agent's error file say why
    assert "traceback : watchdog: no progress for" in r.stderr, r.stderr
    m = re.search(r"stacks: (\S+/stacks.txt)", r.stderr)
    assert m, r.stderr
    assert "comm=python3" in open(m.group(1)).read()
    err = json.loads(errfile.read_text())
    assert err["message"]["message"].startswith("WatchdogTimeout:"), err


PY_GDB = "/usr/share/gdb/auto-load/usr/bin/python3.11-gdb.py"


def test_python_worker_stacks_name_the_python_function(tmp_path):
    # gdb's py-bt reads Debian's non-debug python3.11 with python3.11-dbg's
    # symbols and its gdb extension (auto-loaded from PY_GDB).
    if not shutil.which("gdb") or not os.path.exists(PY_GDB):
        pytest.skip("needs gdb and python3.11-dbg (tools/setup.sh --test installs them)")
    script = tmp_path / "worker.py"
    script.write_text(PY_WORKER)
    r, _ = cddprun(
        ["--nproc_per_node=1", "--max_restarts=0", "--watchdog_timeout=1",
         "--log_dir", tmp_path / "logs", script],
        {"HANG_STEPS": "2", "HANG_PERIOD_MS": "100", "HANG_ATTEMPTS": "0",
         "HANG_FORK": "1", "PYTHON_EXEC": "/usr/bin/python3"})
    assert r.returncode == EXIT_HUNG, r.stderr
    stacks = list((tmp_path / "logs").glob("*/attempt_0/0/stacks.txt"))
    assert len(stacks) == 1, stacks
    text = stacks[0].read_text()
    if "A0904" in r.stderr and "Traceback (most recent call first)" not in text:
        # gdb loads python3.11-dbg's symbols in about 2 s on an idle core;
        # on a loaded machine it can run out of its 5 s bound (the bound
        # holds: the restart was not delayed further)
        pytest.skip("gdb ran out of its 5 s bound before py-bt (machine loaded)")
    # the Python frames, innermost first: the function it blocks in, then its caller
    assert "Traceback (most recent call first)" in text, text
    assert re.search(r'File ".*worker.py", line \d+, in hang_in_python', text), text
    assert "in <module>" in text, text
    # every process of the worker's group, its forked child too
    assert text.count("# gdb, process ") == 2, text
    if "A0904" not in r.stderr:
        assert re.search(r'File ".*worker.py", line \d+, in child_blocked', text), text


def test_initial_timeout_covers_startup(tmp_path):
    r, _ = cddprun(
        ["--nproc_per_node=1", "--watchdog_timeout=5", "--watchdog_initial=1",
         binary("cddp-hang-worker")],
        {"HANG_STEPS": "0", "HANG_ATTEMPTS": "0"})
    assert r.returncode == EXIT_HUNG, r.stderr
    lines = hung_lines(r.stderr)
    assert len(lines) == 1 and "before its first progress line" in lines[0], r.stderr
    assert "--watchdog_initial" in lines[0]


def test_auto_learns_from_steady_steps(tmp_path):
    # 0.2 s steps, warm-up 5, safety 5: about 1 s (with the floor at 1 s).
    r, _ = cddprun(
        ["--nproc_per_node=1", "--max_restarts=1", "--watchdog_timeout=auto",
         "--watchdog_floor=1", binary("cddp-hang-worker")],
        {"HANG_STEPS": "8", "HANG_PERIOD_MS": "200", "HANG_ATTEMPTS": "0",
         "LOGLEVEL": "INFO"})
    assert r.returncode == 0, r.stderr
    lines = hung_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert 0.9 <= silence(lines[0]) < 2.5, lines[0]
    assert "A0902" in r.stderr  # the learned timeout was logged


def test_auto_timeout_never_below_the_floor(tmp_path):
    # The same steps learn about 1 s, but the floor (here 2.5 s; 60 s by
    # default) is the least timeout: the stall is caught after the floor.
    r, _ = cddprun(
        ["--nproc_per_node=1", "--max_restarts=1", "--watchdog_timeout=auto",
         "--watchdog_floor=2.5", binary("cddp-hang-worker")],
        {"HANG_STEPS": "8", "HANG_PERIOD_MS": "200", "HANG_ATTEMPTS": "0",
         "LOGLEVEL": "INFO"})
    assert r.returncode == 0, r.stderr
    lines = hung_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert 2.4 <= silence(lines[0]) < 4.0, lines[0]


def test_auto_slow_but_steady_not_killed(tmp_path):
    # Steps of 0.2 s, then one of 0.8 s: within 5 x the longest seen.
    r, _ = cddprun(
        ["--nproc_per_node=1", "--watchdog_timeout=auto", "--watchdog_warmup=3",
         "--watchdog_floor=1", binary("cddp-hang-worker")],
        {"HANG_STEPS": "8", "HANG_PERIOD_MS": "200", "HANG_SLOW_MS": "900",
         "HANG_ATTEMPTS": "none"})
    assert r.returncode == 0, r.stderr
    assert not hung_lines(r.stderr)


def test_watchdog_off_changes_nothing(tmp_path):
    r, _ = cddprun(
        ["--nproc_per_node=1", binary("cddp-hang-worker")],
        {"HANG_STEPS": "3", "HANG_PERIOD_MS": "50", "HANG_ATTEMPTS": "none"})
    assert r.returncode == 0, r.stderr
    assert not hung_lines(r.stderr)


def test_status_and_metrics_show_the_watchdog(tmp_path):
    port = free_port()
    env = dict(os.environ, HANG_STEPS="3", HANG_PERIOD_MS="100", HANG_ATTEMPTS="0")
    p = subprocess.Popen(
        [binary("cddprun"), "--nproc_per_node=1", "--max_restarts=1",
         "--watchdog_timeout=1.5", f"--status_port={port}", "--status_linger=30",
         binary("cddp-hang-worker")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        st = None
        seen_timeout = False
        while time.monotonic() < deadline and not seen_timeout:
            try:
                st = json.loads(urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/status", timeout=5).read())
                seen_timeout = st["workers"][0].get("watchdog_timeout_s") == 1.5
            except Exception:
                pass
            time.sleep(0.05)
        assert seen_timeout, st
        while time.monotonic() < deadline:
            try:
                st = json.loads(urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/status", timeout=5).read())
            except Exception:
                st = None
            if st and st["state"] == "succeeded":
                break
            time.sleep(0.1)
        assert st and st["state"] == "succeeded", st
        assert st["watchdog"] == {"mode": "fixed", "kills": 1}
        assert st["worker_exits"]["watchdog"] == 1
        assert st["restarts"]["count"] == 1
        m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "cddp_agent_watchdog_kills_total 1" in m
        assert 'cddp_agent_worker_exits_total{reason="watchdog"} 1' in m
        # The run's history says why it restarted (the dashboard's marker).
        h = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/history",
                                              timeout=5).read())
        (restart,) = [e for e in h["events"] if e["kind"] == "restart"]
        assert "local_rank 0 (rank 0) hung" in restart["reason"], restart
        assert restart["step"] is not None, restart
    finally:
        p.send_signal(15)
        p.communicate(timeout=20)


def test_no_progress_restarts_stop_the_job(tmp_path):
    # Every attempt reports steps 0..2 and hangs: the restarts make no
    # progress beyond step 2, so the second one in a row ends the job
    # although --max_restarts allows more.
    r, _ = cddprun(
        ["--nproc_per_node=1", "--max_restarts=5", "--max_no_progress_restarts=2",
         "--watchdog_timeout=1", binary("cddp-hang-worker")],
        {"HANG_STEPS": "3", "HANG_PERIOD_MS": "50", "HANG_ATTEMPTS": "0,1,2,3,4,5"})
    assert r.returncode == EXIT_NO_PROGRESS, r.stderr
    assert 'exit code: 4 (no_progress; docs/cli.md' in r.stderr, r.stderr
    assert len(hung_lines(r.stderr)) == 3, r.stderr
    stop = [l for l in r.stderr.splitlines() if "A0903" in l]
    assert len(stop) == 1 and "2 restarts in a row" in stop[0] and "beyond 2" in stop[0], r.stderr
    assert "attempt 3" not in r.stderr


def test_no_progress_stop_off_when_restarts_progress(tmp_path):
    # Each attempt gets further (steps continue from the restart count),
    # so the stop never fires and the budget decides.
    script = tmp_path / "worker.py"
    script.write_text(
        "import os, sys\n"
        "fd = int(os.environ['CDDP_PROGRESS_FD'])\n"
        "n = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "os.write(fd, ('{\"step\":%d}\\n' % (10 * n)).encode())\n"
        "sys.exit(0 if n == 3 else 1)\n")
    r, _ = cddprun(["--nproc_per_node=1", "--max_restarts=3", "--max_no_progress_restarts=1",
                    script], {})
    assert r.returncode == 0, r.stderr
    assert "A0903" not in r.stderr


def test_cddpctl_stacks_on_demand(tmp_path):
    # No watchdog: the user asks. Every running worker's stacks come back
    # through the status port (POST /stacks, then GET /stacks).
    port = free_port()
    env = dict(os.environ, HANG_STEPS="1", HANG_PERIOD_MS="50", HANG_ATTEMPTS="0")
    p = subprocess.Popen(
        [binary("cddprun"), "--nproc_per_node=2", f"--status_port={port}",
         f"--master_port={free_port()}", "--log_dir", str(tmp_path / "logs"),
         binary("cddp-hang-worker")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def running():
            try:
                st = json.loads(urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/status", timeout=5).read())
                return st["state"] == "running" and all(
                    (w.get("progress") or {}).get("step") is not None for w in st["workers"])
            except Exception:
                return False
        deadline = time.monotonic() + 20
        while not running() and time.monotonic() < deadline:
            assert p.poll() is None, p.communicate()[1]
            time.sleep(0.1)
        t0 = time.monotonic()
        r = run([binary("cddpctl"), "stacks", f"127.0.0.1:{port}"], timeout=30)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        out = r.stdout
        assert out.startswith("# capture 1: "), out[:200]
        assert "## local_rank 0" in out and "## local_rank 1" in out, out
        assert out.count("comm=cddp-hang-worke") >= 2, out  # /proc's part (comm is 15 chars)
        if shutil.which("gdb"):
            assert out.count("hang_here") >= 2, out
        assert took < 12  # bounded: gdb gets 5 s
        path = out.split("\n", 1)[0].split(": ", 1)[1]
        assert path.startswith(str(tmp_path / "logs")) and os.path.exists(path), path
        # a second request gets a fresh capture
        r = run([binary("cddpctl"), "stacks", f"127.0.0.1:{port}"], timeout=30)
        assert r.returncode == 0 and r.stdout.startswith("# capture 2: "), r.stdout[:200]
    finally:
        p.send_signal(15)
        p.communicate(timeout=30)


def test_cddpctl_stacks_errors(tmp_path):
    # Nothing listening: unreachable (2); a usage error (2).
    r = run([binary("cddpctl"), "stacks", f"127.0.0.1:{free_port()}"], timeout=30)
    assert r.returncode == 2, r.stderr
    r = run([binary("cddpctl"), "stacks"], timeout=30)
    assert r.returncode == 2 and "no HOST:PORT" in r.stderr, r.stderr


# ---- workers stuck at exit ----------------------------------------------

STUCK_WORKER = r"""
import os, signal, sys, time
rank = int(os.environ["LOCAL_RANK"])
if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) > 0:
    sys.exit(0)
if rank == 0:
    time.sleep(1.0)
    sys.exit(1)  # fails: the group is stopped, and the other rank with it
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.environ["STUCK_PIDFILE"], "w") as f:
    f.write(str(os.getpid()))
if os.environ["STUCK_MODE"] == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
else:
    os.stat(os.environ["STUCK_TRAP"] + "/x")  # never answered: S, then D after SIGKILL
time.sleep(60)
"""

# A FUSE file system that answers FUSE_INIT and nothing else: a process that
# touches it waits for an answer that never comes, and after SIGKILL it
# waits uninterruptibly (D), as on a hung mount. Killing this daemon aborts
# the connection and frees it.
FUSE_TRAP = r"""
import ctypes, os, struct, sys
mnt = sys.argv[1]
fd = os.open("/dev/fuse", os.O_RDWR)
libc = ctypes.CDLL(None, use_errno=True)
opts = ("fd=%d,rootmode=40000,user_id=0,group_id=0" % fd).encode()
if libc.mount(b"cddptrap", mnt.encode(), b"fuse", 6, opts) != 0:  # MS_NOSUID | MS_NODEV
    print("mount failed:", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(3)
print("mounted", flush=True)
while True:
    buf = os.read(fd, (1 << 20) + 4096)
    length, op, unique = struct.unpack_from("<IIQ", buf)
    if op == 26:  # FUSE_INIT: version 7.<the kernel's>, no features
        major, minor, readahead, flags = struct.unpack_from("<IIII", buf, 40)
        out = struct.pack("<IIIIHHIIHHI", 7, minor, readahead, 0, 0, 0, 4096, 1, 0, 0, 0)
        out += bytes(28)
        os.write(fd, struct.pack("<IiQ", 16 + len(out), 0, unique) + out)
        print("ready", flush=True)
"""

# Runs inside a private mount namespace (unshare -m): mounts the trap, runs
# cddprun, then frees the stuck worker and reports as JSON.
FUSE_RUN = r"""
import json, os, subprocess, sys, time
trap_py, mnt, pidfile = sys.argv[1:4]
cmd = sys.argv[4:]
d = subprocess.Popen([sys.executable, trap_py, mnt], stdout=subprocess.PIPE, text=True)
out = {"mounted": False}
try:
    if d.stdout.readline().strip() == "mounted" and d.stdout.readline().strip() == "ready":
        out["mounted"] = True
        t0 = time.monotonic()
        # to files: the stuck worker keeps its copies of cddprun's stdout and
        # stderr open, so pipes would not reach end-of-file before it is freed
        with open(pidfile + ".out", "w+") as o, open(pidfile + ".err", "w+") as e:
            rc = subprocess.run(cmd, stdout=o, stderr=e, timeout=120).returncode
            o.seek(0)
            e.seek(0)
            out.update(rc=rc, stdout=o.read(), stderr=e.read(), took=time.monotonic() - t0)
        pid = int(open(pidfile).read())
        with open("/proc/%d/stat" % pid) as f:
            out["state_after"] = f.read().rsplit(")", 1)[1].split()[0]
finally:
    d.kill()
    d.wait()
    for _ in range(200):  # the aborted connection frees the stuck worker
        if not os.path.exists(pidfile) or not os.path.exists("/proc/" + open(pidfile).read()):
            break
        time.sleep(0.05)
    subprocess.run(["umount", "-l", mnt], capture_output=True)
print(json.dumps(out))
"""


def stuck_args(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_WORKER)
    return [binary("cddprun"), "--nproc_per_node=2", "--max_restarts=1",
            f"--master_port={free_port()}", str(script)]


def test_stuck_at_exit_stopped_worker_is_killed(tmp_path):
    # Ignores SIGTERM and is stopped (SIGSTOP): the shutdown timeout's
    # SIGKILL still ends it, and the restart goes on.
    env = dict(os.environ, STUCK_MODE="stop", STUCK_PIDFILE=str(tmp_path / "pid"),
               TORCH_ELASTIC_SHUTDOWN_TIMEOUT="1", PYTHON_EXEC="/usr/bin/python3",
               LOGLEVEL="INFO")
    t0 = time.monotonic()
    r = run(stuck_args(tmp_path), env=env, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "forcefully exiting via SIGKILL" in r.stderr, r.stderr
    assert "A2414" not in r.stderr  # SIGKILL was enough
    assert "attempt 1" in r.stderr
    assert took < 30


def test_stuck_at_exit_unkillable_worker_is_given_up(tmp_path):
    # A worker in D state after SIGKILL (a hung FUSE mount in a private mount
    # namespace): the agent waits max(shutdown timeout, 5 s) after SIGKILL,
    # reports the pid and its state, and restarts without it.
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse") or not shutil.which("unshare"):
        pytest.skip("needs root, /dev/fuse and unshare for a FUSE mount in a mount namespace")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (tmp_path / "trap.py").write_text(FUSE_TRAP)
    (tmp_path / "run.py").write_text(FUSE_RUN)
    pidfile = tmp_path / "pid"
    env = dict(os.environ, STUCK_MODE="fuse", STUCK_PIDFILE=str(pidfile), STUCK_TRAP=str(mnt),
               TORCH_ELASTIC_SHUTDOWN_TIMEOUT="1", PYTHON_EXEC="/usr/bin/python3",
               LOGLEVEL="INFO")
    r = run(["unshare", "-m", "--propagation", "private", "/usr/bin/python3",
             str(tmp_path / "run.py"), str(tmp_path / "trap.py"), str(mnt), str(pidfile),
             *stuck_args(tmp_path)], env=env, timeout=150)
    if r.returncode != 0 or not r.stdout.strip():
        pytest.skip(f"no FUSE mount in a mount namespace here: {r.stderr.strip()[-300:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if not out["mounted"]:
        pytest.skip("the FUSE trap could not be mounted here")
    assert out["rc"] == 0, out["stderr"]
    stuck = [l for l in out["stderr"].splitlines() if "A2414" in l]
    assert len(stuck) == 1, out["stderr"]
    pid = pidfile.read_text()
    assert f"pid {pid} (python3) state D (uninterruptible" in stuck[0], stuck[0]
    assert "local_rank 1" in stuck[0] and "after SIGKILL" in stuck[0]
    assert out["state_after"] == "D"  # still stuck when cddprun had finished
    assert "attempt 1" in out["stderr"]
    # 1 s to SIGKILL, 5 s more, then attempt 1; not forever
    assert 6 <= out["took"] < 40, out["took"]
