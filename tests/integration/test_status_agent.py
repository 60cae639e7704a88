"""cddprun's status port end to end: real cddprun runs with real worker
processes, fetched with curl and cddpctl (and the strict metrics parser)
through the run's life: running, a worker failure and the restart, the final
failure, success, a signal; the progress channel with a worker that reports
(the documented Python snippet) and one that writes garbage; flags and their
errors; no orphans and no port left behind.

Workers are small scripts that wait for files the test writes, so each phase
lasts until the test has looked at it. With the static rendezvous a round
comes on the next loop turn, so the "rendezvous" state cannot be held open
here: test_status_multinode.py holds it open with a node waiting for another.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

import promparse
from conftest import binary, free_port, port_is_closed, run, server_backlog, wait_for
from statusserver import cddpctl, curl, get_json, progress_snippet

PROM_CTYPE = "text/plain; version=0.0.4; charset=utf-8"


def script(path, body, shebang="#!/bin/sh\n"):
    path.write_text(shebang + body)
    path.chmod(0o755)
    return path


def touch(path, text=""):
    """Writes a file atomically (workers poll for it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.rename(tmp, path)


def fetch(port, path="/status"):
    """(code, body) from the status port, or None while nobody listens."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", path)
        r = c.getresponse()
        out = (r.status, r.read())
        c.close()
        return out
    except OSError:
        return None


def status(port):
    r = fetch(port)
    return json.loads(r[1]) if r and r[0] == 200 else None


def metrics(port):
    code, headers, body = curl(f"http://127.0.0.1:{port}/metrics")
    assert code == 200 and headers["content-type"] == PROM_CTYPE
    return promparse.parse(body.decode(), conventions=True)


class Agent:
    """cddprun in the background with its status port; stderr goes to a file
    (the S0001 line, the failure table)."""

    def __init__(self, background, tmp_path, *args, port=None, env=None):
        self.err_path = tmp_path / "cddprun.err"
        self.out_path = tmp_path / "cddprun.out"
        e = dict(os.environ, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="60")
        e.update(env or {})
        self.port = free_port() if port is None else port
        flag = [] if self.port == "env" else [f"--status_port={self.port}"]
        with open(self.err_path, "w") as err, open(self.out_path, "w") as out:
            self.bg = background([binary("cddprun"), *flag, *args], stdout=out, stderr=err,
                                 env=e)

    def stderr(self):
        return self.err_path.read_text()

    def wait_state(self, state, pred=lambda st: True, timeout=20):
        def ready():
            st = status(self.port)
            return st if st and st["state"] == state and pred(st) else None
        return wait_for(ready, timeout=timeout, what=f"state {state}")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def code(self, path, *args):
        return curl(self.url(path), *args)[0]


def proc_environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return dict(kv.split("=", 1) for kv in fh.read().decode().split("\0") if "=" in kv)


# Rank R of attempt A: reports one progress line (attempt 0 adds an epoch, so
# the restart's reset shows), then exits with the code in exit.R.A once the
# test writes it. On SIGTERM it records term.R.A and exits 143 only once
# release.A exists: the agent's stopping phase lasts until the test ends it.
LIFECYCLE_WORKER = r"""
A=$TORCHELASTIC_RESTART_COUNT R=$LOCAL_RANK
trap 'touch "$D/term.$R.$A"; while [ ! -e "$D/release.$A" ]; do sleep 0.02; done; exit 143' TERM
if [ "$A" = 0 ]; then
  printf '{"step":%d,"epoch":7}\n' $((100 * A + R)) >&"$CDDP_PROGRESS_FD"
else
  printf '{"step":%d}\n' $((100 * A + R)) >&"$CDDP_PROGRESS_FD"
fi
while [ ! -e "$D/exit.$R.$A" ]; do sleep 0.02; done
exit "$(cat "$D/exit.$R.$A")"
"""


def test_endpoints_through_a_run(background, tmp_path):
    """Every endpoint and status code as a real run goes from running through
    a worker failure and the restart to its final failure; then the port is
    gone."""
    w = script(tmp_path / "worker", LIFECYCLE_WORKER)
    a = Agent(background, tmp_path, "--nproc_per_node=2", "--max_restarts=1", "--rdzv_id=job-s",
              "--status_linger=60", str(w), env={"D": str(tmp_path)})
    port, target = a.port, f"127.0.0.1:{a.port}"

    # ---- running (attempt 0) ----
    st = a.wait_state("running", lambda s: all(w["progress"] for w in s["workers"]))
    assert (st["kind"], st["program"], st["run_id"], st["ready"]) == ("agent", "cddprun",
                                                                       "job-s", True)
    assert (st["node_rank"], st["nnodes"], st["world_size"], st["local_world_size"],
            st["round"]) == (0, 1, 2, 2, 1)
    assert st["rdzv"] == {"backend": "static", "endpoint": "127.0.0.1:29500",
                          "master_addr": "127.0.0.1", "master_port": 29500,
                          "connected": True, "disconnected_at": None, "reconnects": 0}
    assert st["rdzv_server"] is None  # one static node hosts no server
    assert st["restarts"] == {"count": 0, "max": 1, "remaining": 1,
                              "by_reason": {"worker_failure": 0, "membership_change": 0},
                              "scope": "group", "by_scope": {"worker": 0, "group": 0},
                              "scope_fallbacks": 0, "node_replacements": 0,
                              "generation": 0, "spares": 0, "last_recovery_s": None}
    assert st["last_round_duration_s"] >= 0 and st["last_round_at"] >= st["started_at"]
    assert (st["exit_code"], st["exit_reason"]) == (None, None)  # still running
    g = st["goodput"]  # steps reported: the group is productive
    assert g["phase"] == "productive" and g["lost_steps"] == 0, g
    assert abs(sum(g["seconds"].values()) - g["wall_s"]) < 0.01, g
    pids0 = []
    for lr, wk in enumerate(st["workers"]):
        assert (wk["local_rank"], wk["rank"], wk["state"], wk["exit_code"], wk["signal"],
                wk["restarts"]) == (lr, lr, "running", None, None, 0)
        # a real worker of this test, with its progress pipe on fd 3
        env = proc_environ(wk["pid"])
        assert env["CDDP_TEST_TAG"] == os.environ["CDDP_TEST_TAG"]
        assert env["CDDP_PROGRESS_FD"] == "3"
        assert os.readlink(f"/proc/{wk['pid']}/fd/3").startswith("pipe:")
        p = wk["progress"]
        assert (p["step"], p["epoch"], p["lines"], p["malformed"]) == (lr, 7, 1, 0)
        pids0.append(wk["pid"])
    for path in ("/livez", "/healthz", "/readyz"):
        code, headers, body = curl(a.url(path))
        assert (code, body) == (200, b"ok\n"), path
    code, _, body = curl(a.url("/readyz?verbose"))
    assert code == 200
    assert body == b"[+]loop ok\n[+]rendezvous ok\n[+]workers ok\nreadyz check passed\n"
    m = metrics(port)
    assert promparse.value(m, "cddp_agent_state", state="running") == 1
    assert sum(s.value for s in m["cddp_agent_state"].samples) == 1
    assert promparse.value(m, "cddp_agent_ready") == 1
    assert promparse.value(m, "cddp_agent_workers", state="running") == 2
    assert promparse.value(m, "cddp_agent_rdzv_round") == 1
    assert promparse.value(m, "cddp_worker_progress_step", local_rank="1") == 1
    assert promparse.value(m, "cddp_build_info", program="cddprun") == 1
    assert promparse.value(m, "cddp_agent_info", run_id="job-s") == 1
    # bad requests get their codes; the run goes on
    assert a.code("/nope") == 404
    assert a.code("/status", "-X", "POST") == 405
    assert a.code("/livez", "-H", "X-Pad: " + "a" * 10000) == 431
    code_h, headers_h, body_h = curl(a.url("/status"), "-I")
    assert (code_h, body_h) == (200, b"") and headers_h["content-type"] == "application/json"
    r = cddpctl("health", target)
    assert (r.returncode, r.stdout) == (0, f"{target} ready\n")
    r = cddpctl("status", target)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^state +running \(ready\)$", r.stdout, re.M)
    assert re.search(r"^run +job-s$", r.stdout, re.M)
    served = json.loads(cddpctl("status", target, "--json").stdout)
    assert served["kind"] == "agent" and served["workers"][0]["pid"] == pids0[0]

    # ---- rank 1 fails: the group is stopped to restart ----
    touch(tmp_path / "exit.1.0", "3")
    st = a.wait_state("restarting", lambda s: (tmp_path / "term.0.0").exists())
    assert st["ready"] is False
    w0, w1 = st["workers"]
    assert (w1["state"], w1["exit_code"], w1["signal"], w1["pid"]) == ("failed", 3, None, None)
    assert w1["exited_at"] >= w1["started_at"] > 0
    assert (w0["state"], w0["pid"]) == ("running", pids0[0])  # still in its SIGTERM handler
    assert st["worker_exits"]["failure"] == 1
    code, _, body = curl(a.url("/readyz?verbose"))
    assert code == 503
    assert b"[+]loop ok\n" in body and b"[+]rendezvous ok\n" in body
    assert b"[-]workers failed: worker group is not running (agent state: restarting)\n" in body
    assert a.code("/livez") == 200
    m = metrics(port)
    assert promparse.value(m, "cddp_agent_state", state="restarting") == 1
    assert promparse.value(m, "cddp_agent_worker_exits_total", reason="failure") == 1
    assert abs(promparse.value(m, "cddp_worker_last_exit_timestamp_seconds", local_rank="1") -
               w1["exited_at"]) < 0.001
    r = cddpctl("health", target)
    assert r.returncode == 1 and "[-]workers failed" in r.stdout
    assert cddpctl("health", target, "--live").returncode == 0

    # ---- rank 0 ends its stop; attempt 1 runs in round 2 ----
    touch(tmp_path / "release.0")
    st = a.wait_state("running", lambda s: s["round"] == 2 and all(
        w["progress"] and w["progress"]["step"] is not None and w["progress"]["step"] >= 100
        for w in s["workers"]))
    assert st["restarts"] == {"count": 1, "max": 1, "remaining": 0,
                              "by_reason": {"worker_failure": 1, "membership_change": 0},
                              "scope": "group", "by_scope": {"worker": 0, "group": 1},
                              "scope_fallbacks": 0, "node_replacements": 0,
                              "generation": 0, "spares": 0, "last_recovery_s": None}
    assert st["worker_exits"] == {"success": 0, "failure": 1, "signal": 0,
                                  "collective_timeout": 0, "watchdog": 0, "stopped": 1}
    for lr, wk in enumerate(st["workers"]):
        assert wk["state"] == "running" and wk["restarts"] == 1 and wk["pid"] not in pids0
        p = wk["progress"]
        # a new attempt starts from empty values; the line counters go on
        assert (p["step"], p["epoch"], p["lines"]) == (100 + lr, None, 2)
    assert st["workers"][0]["exit_code"] == 143  # the last exit: stopped by the agent
    assert a.code("/readyz") == 200
    m = metrics(port)
    assert promparse.value(m, "cddp_agent_restarts_total", reason="worker_failure") == 1
    assert promparse.value(m, "cddp_agent_restarts_total", reason="membership_change") == 0
    assert promparse.value(m, "cddp_agent_worker_exits_total", reason="stopped") == 1
    assert promparse.value(m, "cddp_agent_rdzv_round") == 2
    assert promparse.value(m, "cddp_worker_progress_lines_total", local_rank="0") == 2

    # ---- rank 0 fails with no restart left: stopping for good ----
    touch(tmp_path / "exit.0.1", "5")
    st = a.wait_state("stopping", lambda s: (tmp_path / "term.1.1").exists())
    code, _, body = curl(a.url("/readyz?verbose"))
    assert code == 503 and b"(agent state: stopping)" in body

    # ---- failed: the final status is served while the agent lingers ----
    touch(tmp_path / "release.1")
    st = a.wait_state("failed")
    assert (st["exit_code"], st["exit_reason"]) == (1, "failure")  # a worker, past its restarts
    w0, w1 = st["workers"]
    assert (w0["state"], w0["exit_code"]) == ("failed", 5)
    assert (w1["state"], w1["exit_code"]) == ("stopped", 143)
    assert st["worker_exits"]["failure"] == 2 and st["worker_exits"]["stopped"] == 2
    code, _, body = curl(a.url("/readyz?verbose"))
    assert code == 503 and b"[-]workers failed: worker group is not running (agent state: failed)" \
        in body
    assert a.code("/livez") == 200  # alive while it lingers
    m = metrics(port)
    assert promparse.value(m, "cddp_agent_state", state="failed") == 1
    assert promparse.value(m, "cddp_agent_ready") == 0
    assert promparse.value(m, "cddp_agent_workers", state="failed") == 1
    assert promparse.value(m, "cddp_agent_workers", state="stopped") == 1
    r = cddpctl("health", target)
    assert r.returncode == 1
    r = cddpctl("status", target)
    assert r.returncode == 0 and re.search(r"^state +failed \(not ready\)$", r.stdout, re.M), r.stdout
    assert re.search(r"^restarts +1 of 1$", r.stdout, re.M)
    assert re.search(r"^exit +1 \(failure\)$", r.stdout, re.M), r.stdout
    assert re.search(r"^goodput +\d+\.\d% of ", r.stdout, re.M), r.stdout

    # A handled signal ends the wait; the exit status is the run's.
    a.bg.signal(signal.SIGTERM)
    assert a.bg.wait(20) == 1
    err = a.stderr()
    assert "S0001: status port: listening" not in err  # INFO: not shown at WARNING
    assert "exitcode  : 5" in err  # the failure table
    assert port_is_closed(port)
    r = cddpctl("health", target)
    assert r.returncode == 2


def test_success_port_zero_and_python_progress(background, tmp_path):
    """--status_port=0 picks a port and logs it (S0001); the documented Python
    snippet reports progress; the last line before the exit is not lost; the
    final 'succeeded' is served until the linger ends."""
    body = progress_snippet() + r"""
import os, pathlib, time
d = pathlib.Path(os.environ["D"])
rank = int(os.environ["LOCAL_RANK"])
for step in range(3):
    report(step=step, epoch=1, loss=2.5 - step, samples_per_s=100.0 * (rank + 1))
while not (d / "go").exists():
    time.sleep(0.02)
report(step=41 + rank, loss=float("nan") if rank == 1 else 0.25)
"""
    w = script(tmp_path / "worker.py", body, shebang="")
    a = Agent(background, tmp_path, "--nproc_per_node=2", "--status_linger=60", str(w), port=0,
              env={"D": str(tmp_path)})
    m = wait_for(lambda: re.search(r"WARNING S0001: status port: picked free port (\d+): "
                                   r"http://127\.0\.0\.1:(\d+)/status", a.stderr()),
                 timeout=20, what="the S0001 line")
    assert m.group(1) == m.group(2)
    a.port = port = int(m.group(1))
    st = a.wait_state("running", lambda s: all(
        w["progress"] and w["progress"]["step"] == 2 for w in s["workers"]))
    for rank, wk in enumerate(st["workers"]):
        p = wk["progress"]
        assert (p["epoch"], p["loss"], p["samples_per_s"], p["lines"]) == (
            1, 0.5, 100.0 * (rank + 1), 3)
        assert p["time"] > st["started_at"] and p["age_s"] >= 0 and p["step_age_s"] >= 0
    m = metrics(port)
    assert promparse.value(m, "cddp_worker_loss", local_rank="0") == 0.5
    assert promparse.value(m, "cddp_worker_samples_per_second", local_rank="1") == 200.0
    assert promparse.value(m, "cddp_worker_last_progress_timestamp_seconds", local_rank="0") > 0

    touch(tmp_path / "go")
    st = a.wait_state("succeeded")
    assert st["ready"] is False
    assert st["worker_exits"]["success"] == 2 and sum(st["worker_exits"].values()) == 2
    for rank, wk in enumerate(st["workers"]):
        assert (wk["state"], wk["exit_code"], wk["pid"]) == ("succeeded", 0, None)
        assert wk["progress"]["step"] == 41 + rank and wk["progress"]["lines"] == 4
    assert st["workers"][1]["progress"]["loss"] == "NaN"
    assert st["workers"][0]["progress"]["loss"] == 0.25
    m = metrics(port)
    assert m["cddp_worker_loss"].samples[1].value != m["cddp_worker_loss"].samples[1].value  # NaN
    assert promparse.value(m, "cddp_agent_state", state="succeeded") == 1
    code, _, body = curl(a.url("/readyz?verbose"))
    assert code == 503 and b"(agent state: succeeded)" in body
    assert a.code("/livez") == 200
    a.bg.signal(signal.SIGINT)
    assert a.bg.wait(20) == 0
    assert port_is_closed(port)


def test_garbage_and_a_flood_of_progress(background, tmp_path):
    """A worker that writes garbage has it counted and ignored. One that
    writes 20000 lines in one burst has every line read; then 1000 lines
    written one by one over a second cost a handful of snapshots (coalesced),
    not one per read."""
    body = r"""
import os, pathlib, time
fd = int(os.environ["CDDP_PROGRESS_FD"])
d = pathlib.Path(os.environ["D"])
if os.environ["LOCAL_RANK"] == "0":
    os.write(fd, "".join('{"step":%d,"samples_per_s":1.5}\n' % i for i in range(20000)).encode())
else:
    for junk in (b"not json\n", b'{"step":"seven"}\n', b"[1,2,3]\n", b'{"step":-1}\n',
                 b'{"loss":1' + b"0" * 5000 + b'}\n', b"\n\n", b'{"step":5,"extra":{"a":[1]}}\n'):
        os.write(fd, junk)
(d / ("wrote." + os.environ["LOCAL_RANK"])).touch()
while not (d / "flood").exists():
    time.sleep(0.02)
if os.environ["LOCAL_RANK"] == "0":
    for i in range(1000):
        os.write(fd, b'{"step":%d}\n' % (20000 + i))
        time.sleep(0.001)
while not (d / "go").exists():
    time.sleep(0.02)
if os.environ["LOCAL_RANK"] == "1":
    os.write(fd, b'{"step":6}')  # no newline: taken as a line at EOF
"""
    w = script(tmp_path / "worker.py", body, shebang="")
    a = Agent(background, tmp_path, "--nproc_per_node=2", "--status_linger=60", str(w),
              env={"D": str(tmp_path)})

    def read(lines0):
        def pred(s):
            p0, p1 = (w["progress"] or {} for w in s["workers"])
            return p0.get("lines") == lines0 and p1.get("malformed") == 5
        return pred
    st = a.wait_state("running", read(20000), timeout=30)
    p0, p1 = st["workers"][0]["progress"], st["workers"][1]["progress"]
    assert (p0["step"], p0["malformed"], p0["samples_per_s"]) == (19999, 0, 1.5)
    assert (p1["step"], p1["lines"], p1["loss"]) == (5, 1, None)
    m = metrics(a.port)
    assert promparse.value(m, "cddp_worker_progress_malformed_lines_total", local_rank="1") == 5
    assert promparse.value(m, "cddp_worker_progress_lines_total", local_rank="0") == 20000
    before = promparse.value(m, "cddp_status_snapshots_published_total")
    t0 = time.monotonic()
    touch(tmp_path / "flood")
    st = a.wait_state("running", read(21000), timeout=30)
    elapsed = time.monotonic() - t0
    published = promparse.value(metrics(a.port), "cddp_status_snapshots_published_total") - before
    # At most one per 250 ms for progress, plus the 1 s tick (a read per
    # line, uncoalesced, would be up to 1000).
    assert st["workers"][0]["progress"]["step"] == 20999
    assert published <= 6 * elapsed + 4, (published, elapsed)
    touch(tmp_path / "go")
    st = a.wait_state("succeeded")
    assert st["workers"][1]["progress"]["step"] == 6 and st["workers"][1]["progress"]["lines"] == 2
    a.bg.signal(signal.SIGTERM)
    assert a.bg.wait(20) == 0


def test_signal_terminates_and_linger_expires(background, tmp_path):
    """SIGTERM to cddprun: the workers are stopped, the final state is
    'terminated', and the agent exits 128+15 once the linger runs out."""
    w = script(tmp_path / "worker", "exec sleep 60\n")
    a = Agent(background, tmp_path, "--nproc_per_node=2", "--status_linger=2", str(w))
    a.wait_state("running")
    t0 = time.monotonic()
    a.bg.signal(signal.SIGTERM)
    st = a.wait_state("terminated")
    assert (st["exit_code"], st["exit_reason"]) == (143, "signal")  # preempted: 128+15
    assert st["worker_exits"]["stopped"] == 2
    for wk in st["workers"]:
        assert (wk["state"], wk["signal"], wk["signal_name"], wk["exit_code"]) == (
            "stopped", 15, "SIGTERM", None)
    assert a.code("/readyz") == 503
    assert a.bg.wait(30) == 143  # on its own, after the linger
    assert time.monotonic() - t0 >= 2.0
    assert port_is_closed(a.port)


def test_slow_clients_do_not_hold_up_the_run(background, tmp_path):
    """Clients that never finish a request (as many as the connection limit)
    neither delay the agent's handling of its workers nor keep it from
    exiting; their connections are closed at the exit.

    The port listens before any worker starts, so the test waits for the
    workers' own marks, not for a status request: the server might not yet
    have seen that request's connection closed, and would then refuse (reset)
    the last of the 64 as one over its limit. Before it lets the workers end,
    it waits until the server has accepted all 64 and read what they sent:
    the agent may exit within milliseconds, and the kernel resets a
    connection still in the backlog, or closed with bytes unread, instead of
    ending it (seen in CI)."""
    w = script(tmp_path / "worker",
               'touch "$D/up.$LOCAL_RANK"\nwhile [ ! -e "$D/go" ]; do sleep 0.02; done\n')
    a = Agent(background, tmp_path, "--nproc_per_node=2", str(w), env={"D": str(tmp_path)})
    wait_for(lambda: all((tmp_path / f"up.{r}").exists() for r in (0, 1)), timeout=20,
             what="both workers up")
    socks = []
    for _ in range(64):
        s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
        s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    wait_for(lambda: server_backlog(a.port) == (0, 0, 64), timeout=10,
             what="the 64 slow clients accepted and read (pending, unread, connections)")
    touch(tmp_path / "go")
    assert a.bg.wait(30) == 0
    for s in socks:
        s.settimeout(5)
        assert s.recv(100) == b""  # closed by the server, no answer
        s.close()
    assert port_is_closed(a.port)


def test_without_libmicrohttpd_the_status_port_is_one_clear_line(tmp_path):
    """libmicrohttpd is opened by the first status server (common/dl.h), not
    at exec. An unloadable libmicrohttpd.so.12 first on the loader's path
    (LD_LIBRARY_PATH and an empty file: the real binaries, no test-only
    switch): --status_port is one line naming the library and the flag,
    exit 1 like a port in use, before any worker; cddp-rdzv likewise; runs
    without a status port never load it."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libmicrohttpd.so.12").write_bytes(b"")
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib))
    marker = tmp_path / "started"
    w = script(tmp_path / "worker", f'touch "{marker}"\n')
    why = f"the status port needs libmicrohttpd: libmicrohttpd.so.12 cannot be loaded ({lib}/"
    r = run([binary("cddprun"), "--status_port=0", w], env=env, timeout=30)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cddprun: error: --status_port=0: {why}"), \
        r.stderr
    assert not marker.exists()
    r = run([binary("cddp-rdzv"), "--port=0", "--status-port=0"], env=env, timeout=30)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cddp-rdzv: --status-port=0: {why}"), r.stderr
    r = run([binary("cddprun"), w], env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert marker.exists()


def test_flags_env_and_errors(background, tmp_path):
    marker = tmp_path / "started"
    w = script(tmp_path / "worker", f'env > "{tmp_path}/env.$LOCAL_RANK"; touch "{marker}"\n')
    cddprun = binary("cddprun")

    def one_line(r, *needles):
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        for n in needles:
            assert n in lines[0], (n, lines[0])

    # A port in use: exit 1 before any worker starts.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run([cddprun, f"--status_port={port}", w], timeout=30)
        assert r.returncode == 1
        one_line(r, f"cddprun: error: --status_port={port}: cannot listen on 127.0.0.1:{port}",
                 "Address already in use")
    assert not marker.exists()
    # An address that does not resolve is a usage error.
    r = run([cddprun, "--status_port=0", "--status_addr=no-such-host.invalid", w], timeout=30)
    assert r.returncode == 2
    one_line(r, "status address 'no-such-host.invalid'")
    # Bad values name the flag or the variable.
    r = run([cddprun, "--status-port=http", w], timeout=30)
    assert r.returncode == 2
    one_line(r, "cddprun: error: --status-port: 'http' is not a port number")
    r = run([cddprun, w], env=dict(os.environ, CDDP_STATUS_PORT="70000"), timeout=30)
    assert r.returncode == 2
    one_line(r, "CDDP_STATUS_PORT: '70000'")
    assert not marker.exists()

    # CDDP_STATUS_PORT alone turns the port on (here on IPv6 loopback).
    port = free_port("::1")
    r = run([cddprun, w], timeout=30,
            env=dict(os.environ, CDDP_STATUS_PORT=str(port), CDDP_STATUS_ADDR="::1",
                     LOGLEVEL="INFO"))
    assert r.returncode == 0, r.stderr
    assert f"S0001: status port: listening on http://[::1]:{port} " in r.stderr
    assert f"S0002: status port: stopped ([::1]:{port})" in r.stderr
    # Without a status port the progress channel is there all the same.
    marker.unlink()
    r = run([cddprun, "--nproc_per_node=2", w], timeout=30)
    assert r.returncode == 0 and "S0001" not in r.stderr
    for lr in range(2):
        env = dict(line.split("=", 1) for line in
                   (tmp_path / f"env.{lr}").read_text().splitlines() if "=" in line)
        assert env["CDDP_PROGRESS_FD"] == "3"
