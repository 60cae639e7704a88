"""Shared pytest fixtures for tests/integration and tests/compat.

Every test drives real binaries from the build directory (CDDP_BUILD_DIR,
default build/). Each test runs with a unique CDDP_TEST_TAG in its
environment, which every process it starts inherits; after the test, any
process still carrying the tag is an orphan: it is killed and the test fails.
"""
import json
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = pathlib.Path(os.environ.get("CDDP_BUILD_DIR", ROOT / "build")).resolve()
# The Python whose torch is the oracle. Debian's interpreter by default
# (python3-torch 1.13.1 lives there, whatever python3 is first on PATH);
# CDDP_TORCH_PYTHON points the suite at another torch, such as the device
# machine's 2.11 (tools/torch-check). torch_info() says what it is.
TORCH_PY = os.environ.get("CDDP_TORCH_PYTHON") or "/usr/bin/python3"


def _sanitized():
    try:
        with open(BUILD / "meson-info" / "intro-buildoptions.json") as fh:
            return any(o["name"] == "sanitize" and o["value"] is True for o in json.load(fh))
    except (OSError, ValueError):
        return False


SANITIZED = _sanitized()

_bin_cache = {}


def binary(name):
    """Path of a built executable (cddprun, cddp-rdzv, cddp-train, cddpctl, ...)."""
    if name not in _bin_cache:
        hits = [p for p in BUILD.rglob(name) if p.is_file() and os.access(p, os.X_OK)
                and ".p" not in p.parent.name]
        if not hits:
            pytest.fail(f"{name} not built in {BUILD} (run tools/setup.sh)")
        _bin_cache[name] = str(sorted(hits, key=lambda p: len(str(p)))[0])
    return _bin_cache[name]


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host="127.0.0.1"):
    """A port that was free a moment ago, below the kernel's ephemeral range.

    Not bind-to-0: that hands out an ephemeral port, and between this
    function's close and the test's server binding it, any process of the
    test (an agent's store on port 0, an outgoing connection) may be given
    the same port by the kernel; an agent then finds its endpoint "served
    already" by a stranger and waits. Below the ephemeral range only an
    explicit bind can take the port."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    # 10000..29000: clear of the ephemeral range and of torchrun's defaults
    # (29400 rendezvous, 29500 MASTER_PORT) that some tests use as they are.
    hi = min(29000, _ephemeral_low())
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, hi)
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_closed(port):
    """Nothing listens on port any more, and a server can bind it again
    (SO_REUSEADDR, as every server does: closed connections may linger in
    TIME_WAIT)."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    return True


def server_backlog(port):
    """What the kernel still holds for a server on 127.0.0.1:port, from
    /proc/net/tcp: (connections waiting to be accepted, bytes received on
    its established connections that it has not read yet, its established
    connections). A server that has accepted and read every client shows
    (0, 0, n)."""
    local = "0100007F:%04X" % port
    pending = unread = conns = 0
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            f = line.split()
            if f[1] != local:
                continue
            rx = int(f[4].split(":")[1], 16)
            if f[3] == "0A":  # LISTEN: rx_queue is the accept queue
                pending += rx
            elif f[3] == "01":  # ESTABLISHED, accepted or not
                unread += rx
                conns += 1
    return pending, unread, conns


def agent_status(port, host="127.0.0.1"):
    """A status port's /status as JSON, or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def wait_for(pred, timeout=10.0, interval=0.02, what="condition"):
    """Polls pred() until it returns a truthy value; fails the test after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def run(args, timeout=60, **kw):
    """subprocess.run with text output captured and a hard timeout."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run([str(a) for a in args], timeout=timeout, **kw)


def _tagged_pids(tag):
    me = os.getpid()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{d}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and f"CDDP_TEST_TAG={tag}".encode() in env.split(b"\0"):
            found.append(int(d))
    return found


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


@pytest.fixture(autouse=True)
def no_orphans(monkeypatch):
    """Tags the test's processes; fails the test if any outlives it."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv("CDDP_TEST_TAG", tag)
    if "PYTHON_EXEC" not in os.environ:
        monkeypatch.setenv("PYTHON_EXEC", TORCH_PY)
    yield tag
    deadline = time.monotonic() + 5.0
    left = _tagged_pids(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _tagged_pids(tag)
    if left:
        desc = [f"{p}: {_cmdline(p)}" for p in left]
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        pytest.fail("processes outlived the test (orphans): " + "; ".join(desc))


class Background:
    """A process started in its own session; killed (TERM, then KILL) at teardown."""

    def __init__(self, args, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        self.args = [str(a) for a in args]
        self.proc = subprocess.Popen(self.args, start_new_session=True, **kw)
        self.out = None
        self.err = None

    @property
    def pid(self):
        return self.proc.pid

    def wait(self, timeout=60):
        try:
            self.out, self.err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.args[0]} did not exit within {timeout}s:\n{self.err}")
        return self.proc.returncode

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            self.out, self.err = self.proc.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError):
            pass


@pytest.fixture
def background():
    """background(args, **popen_kw) -> Background; all are killed at teardown."""
    procs = []

    def start(args, **kw):
        b = Background(args, **kw)
        procs.append(b)
        return b

    yield start
    for b in procs:
        b.kill()


_torch_info = []


def torch_info():
    """What TORCH_PY's torch is and does (tests/compat/torch_probe.py's JSON),
    probed once a session; {"error": ...} when it has no torch."""
    if not _torch_info:
        from compat import side_by_side
        _torch_info.append(side_by_side.probe(TORCH_PY))
    return _torch_info[0]


def torchrun_cmd():
    """The command that starts TORCH_PY's torchrun the way its version needs
    (tests/compat/side_by_side.py's torchrun_cmd says how and why)."""
    from compat import side_by_side
    return side_by_side.torchrun_cmd(TORCH_PY, torch_info())


@pytest.fixture
def torch_python():
    """The oracle's Python (TORCH_PY: Debian's python3 unless CDDP_TORCH_PYTHON
    says otherwise); skips the test if its torch is missing."""
    r = subprocess.run([TORCH_PY, "-c", "import torch, torch.distributed"], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"no torch in {TORCH_PY} (Debian's: tools/setup.sh --test installs "
                    "python3-torch; or set CDDP_TORCH_PYTHON)")
    return TORCH_PY


def pytest_report_header(config):
    lines = [f"cddp build: {BUILD}" + (" (ASan/UBSan)" if SANITIZED else "")]
    if os.environ.get("CDDP_TORCH_PYTHON"):
        info = torch_info()
        lines.append(f"oracle: {TORCH_PY}: " + (info.get("error") or
                     f"torch {info.get('torch')}, Python {info.get('python')}"))
    return lines


sys.path.insert(0, str(ROOT / "tests"))
