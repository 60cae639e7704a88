"""cddpctl against a real status port (tests/helpers/status_testserver) and
against servers that misbehave: refused, silent, hanging up, not JSON."""
import fcntl
import http.server
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import termios
import threading

import pytest

from conftest import binary, free_port, run, wait_for
from statusserver import StatusServer, cddpctl, curl
from test_elastic import FAST, c10d, cluster  # noqa: F401 (fixture)


def one_error_line(r, *needles):
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_status_table_agent(background):
    srv = StatusServer(background, "--workers", "4")
    srv.cmd("state running")
    srv.cmd('progress 0 {"step":120,"epoch":1,"loss":2.31,"samples_per_s":612.5}')
    srv.cmd('progress 1 {"step":7,"loss":NaN}')
    srv.cmd("progress 2 garbage")
    srv.cmd("exit 3 SIGKILL")
    srv.cmd("restart worker_failure")
    srv.cmd("run_id job7")
    r = cddpctl("status", f"127.0.0.1:{srv.port}")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"^run +job7$", out, re.M)
    assert re.search(r"^state +running \(ready\)$", out, re.M)
    assert re.search(r"^restarts +1 of 3$", out, re.M)
    assert re.search(r"^exits +signal 1$", out, re.M)
    rows = {}
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("LOCAL"))
    assert lines[header].split() == ["LOCAL", "RANK", "PID", "STATE", "EXIT", "RESTARTS", "STEP",
                                     "EPOCH", "LOSS", "SAMPLES/S", "LAST", "PROGRESS"]
    for line in lines[header + 1:]:
        cells = line.split()
        rows[cells[0]] = cells
    assert rows["0"][1:10] == ["0", "10000", "running", "-", "0", "120", "1", "2.31", "612.5"]
    assert rows["0"][10].endswith("ms") or rows["0"][10].endswith("s")
    assert rows["1"][6:9] == ["7", "-", "NaN"]
    assert rows["2"][10:] == ["never", "(1", "malformed)"]
    assert rows["3"][2:5] == ["-", "failed", "SIGKILL"]
    assert r.stderr == ""


def test_status_json_is_the_served_json(background):
    srv = StatusServer(background)
    srv.cmd("state running")
    r = cddpctl("status", f"127.0.0.1:{srv.port}", "--json")
    assert r.returncode == 0
    served = json.loads(r.stdout)
    assert served["kind"] == "agent" and served["state"] == "running"
    assert r.stdout.endswith("\n") and r.stdout.count("\n") == 1
    # The same document curl gets (generated_at aside: it is the same snapshot).
    _, _, body = curl(srv.base + "/status")
    assert json.loads(body) == served
    # A URL works as the target, with or without a trailing slash.
    for target in (f"http://127.0.0.1:{srv.port}", f"http://localhost:{srv.port}/"):
        r = cddpctl("status", target, "--json")
        assert r.returncode == 0 and json.loads(r.stdout) == served


def test_status_table_rdzv(background):
    srv = StatusServer(background, "--kind", "rdzv")
    srv.cmd("join job7 10.0.0.2:40000")
    srv.cmd("join job7 10.0.0.3:40000")
    srv.cmd("wait job7 10.0.0.4:40000")
    r = cddpctl("status", f"127.0.0.1:{srv.port}")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^endpoint +0\.0\.0\.0:29400 \(accepting agents\)$", r.stdout, re.M)
    assert re.search(r"^totals +3 joins, 2 rounds$", r.stdout, re.M)
    assert re.search(r"^job7 +joining +2 +2 +1:4 +1 ", r.stdout, re.M)
    assert re.search(r"^job7 +10\.0\.0\.4:40000 +waiting +4 ", r.stdout, re.M)
    assert re.search(r"^job7 +10\.0\.0\.3:40000 +1 +4 ", r.stdout, re.M)


def test_health_exit_codes(background):
    srv = StatusServer(background)
    target = f"127.0.0.1:{srv.port}"
    r = cddpctl("health", target)
    assert r.returncode == 1
    assert r.stdout.splitlines()[0] == f"{target} not ready (HTTP 503)"
    assert "  [-]rendezvous failed: agent state: rendezvous, no round yet" in r.stdout
    assert "[+]loop ok" not in r.stdout  # only the failed checks without --verbose
    srv.cmd("state running")
    r = cddpctl("health", target)
    assert (r.returncode, r.stdout) == (0, f"{target} ready\n")
    r = cddpctl("health", target, "--verbose")
    assert r.returncode == 0 and "[+]workers ok\n" in r.stdout
    srv.cmd("state restarting")
    assert cddpctl("health", target).returncode == 1
    assert cddpctl("health", target, "--live").returncode == 0  # alive, just not ready
    srv.cmd("wedge")
    srv.quit()
    # Nobody there now.
    r = cddpctl("health", target)
    assert r.returncode == 2 and r.stdout == ""
    one_error_line(r, f"cannot connect to {target}: Connection refused")


def test_health_live_fails_when_wedged(background):
    srv = StatusServer(background, "--live-timeout", "200")
    srv.cmd("state running")
    srv.cmd("wedge")
    wait_for(lambda: cddpctl("health", f"127.0.0.1:{srv.port}", "--live").returncode == 1,
             timeout=10, what="cddpctl health --live to fail")
    r = cddpctl("health", f"127.0.0.1:{srv.port}", "--live")
    assert "[-]loop failed: the event loop has not turned for" in r.stdout


def test_refused_and_unresolvable():
    port = free_port()
    for cmd in ("status", "health"):
        r = cddpctl(cmd, f"127.0.0.1:{port}")
        assert r.returncode == 2
        one_error_line(r, "K0003", f"cannot connect to 127.0.0.1:{port}: Connection refused")
    r = cddpctl("status", "no-such-host.invalid:8080")
    assert r.returncode == 2
    one_error_line(r, "cannot resolve the host of no-such-host.invalid:8080")


def test_timeout():
    """A server that accepts (the kernel's backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        for cmd in ("status", "health"):
            r = cddpctl(cmd, f"127.0.0.1:{port}", "--timeout", "0.5")
            assert r.returncode == 2
            one_error_line(r, f"127.0.0.1:{port} did not answer within 0.5s")
        r = cddpctl("status", f"127.0.0.1:{port}", "--timeout=0.3")
        assert r.returncode == 2 and "within 0.3s" in r.stderr


def test_hang_up_without_reply():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]

        def serve():
            for _ in range(2):
                c, _ = s.accept()
                c.recv(4096)
                c.close()

        t = threading.Thread(target=serve)
        t.start()
        r = cddpctl("status", f"127.0.0.1:{port}", "--timeout", "5")
        assert r.returncode == 2
        one_error_line(r, f"127.0.0.1:{port} closed the connection without a reply")
        r = cddpctl("health", f"127.0.0.1:{port}", "--timeout", "5")
        assert r.returncode == 2
        t.join(10)


class _Handler(http.server.BaseHTTPRequestHandler):
    replies = {}

    def do_GET(self):  # noqa: N802 - the http.server API
        code, ctype, body = self.replies.get(self.path.split("?")[0], (404, "text/plain", b"no"))
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def other_server():
    """A real HTTP server that is not a cddp status port."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_not_json_and_http_errors(other_server):
    target = f"127.0.0.1:{other_server.server_address[1]}"
    _Handler.replies = {"/status": (200, "text/html", b"<html><body>hello</body></html>\n")}
    r = cddpctl("status", target)
    assert r.returncode == 1 and r.stdout == ""
    one_error_line(r, f"http://{target}/status did not answer JSON", "text/html",
                   "<html><body>hello</body></html>", f"is {target} a cddp status port?")
    _Handler.replies = {"/status": (200, "application/json", b"[1, 2")}
    r = cddpctl("status", target, "--json")
    assert r.returncode == 1 and r.stdout == ""
    one_error_line(r, "did not answer JSON", "'[1, 2'")
    _Handler.replies = {"/status": (503, "application/json", b'{"error":"warming up"}')}
    r = cddpctl("status", target)
    assert r.returncode == 1
    one_error_line(r, f"http://{target}/status answered HTTP 503: warming up")
    _Handler.replies = {}
    r = cddpctl("status", target)
    assert r.returncode == 1
    one_error_line(r, "answered HTTP 404: no")
    # health: any answer but 200 is "not ready".
    r = cddpctl("health", target)
    assert r.returncode == 1 and "not ready (HTTP 404)" in r.stdout
    _Handler.replies = {"/readyz": (200, "text/plain", b"ok\n")}
    assert cddpctl("health", target).returncode == 0
    # A JSON object of an unknown kind is printed as it came.
    _Handler.replies = {"/status": (200, "application/json", b'{"kind":"future","x":1}')}
    r = cddpctl("status", target)
    assert r.returncode == 0 and json.loads(r.stdout) == {"kind": "future", "x": 1}


@pytest.mark.parametrize("args,needle", [
    ([], "no command"),
    (["bogus", "h:1"], "unknown command 'bogus'"),
    (["status"], "no HOST:PORT"),
    (["status", "node1"], "'node1' has no port"),
    (["status", "node1:99999"], "99999"),
    (["status", "h:1", "--timeout"], "--timeout needs"),
    (["status", "h:1", "--timeout", "0"], "--timeout '0'"),
    (["status", "h:1", "--timeout", "abc"], "--timeout 'abc'"),
    (["status", "h:1", "--frobnicate"], "unknown option '--frobnicate'"),
    (["status", "h:1", "extra"], "unexpected argument 'extra'"),
    (["health", "h:1", "--watch"], "--watch, --interval and --count are options of status and job"),
    (["status", "h:1", "--live"], "--live and --verbose are options of health"),
])
def test_usage_errors(args, needle):
    r = cddpctl(*args)
    assert r.returncode == 2 and r.stdout == ""
    one_error_line(r, "K0001", needle)


def test_help_and_version():
    r = cddpctl("--help")
    assert r.returncode == 0 and "cddpctl status HOST:PORT" in r.stdout
    r = cddpctl("--version")
    assert r.returncode == 0 and r.stdout.startswith("cddpctl ")


def test_ipv6_target(background):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    srv = StatusServer(background, "--addr", "::1")
    srv.cmd("state running")
    r = cddpctl("health", f"[::1]:{srv.port}")
    assert (r.returncode, r.stdout) == (0, f"[::1]:{srv.port} ready\n")


# ---- status --watch --------------------------------------------------------

ALT_ON, ALT_OFF = "\033[?1049h", "\033[?1049l"


class PtyReader:
    """The master side of a pty, read on a thread into one growing string."""

    def __init__(self, rows=40, cols=150):
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.chunks = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)

    def start(self):
        os.close(self.slave)  # the child holds it now
        self.thread.start()

    def _read(self):
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                break  # EIO: the child closed its side
            if not data:
                break
            with self.lock:
                self.chunks.append(data.decode(errors="replace"))

    def text(self):
        with self.lock:
            return "".join(self.chunks)

    def close(self):
        self.thread.join(10)
        os.close(self.master)


def test_watch_on_a_terminal_redraws_in_place_with_bars(background):
    srv = StatusServer(background, "--workers", "2")
    srv.cmd("state running")
    srv.cmd('progress 0 {"step":100,"loss":2.5}')
    srv.cmd('progress 1 {"step":50}')
    t = PtyReader()
    p = background([binary("cddpctl"), "status", f"127.0.0.1:{srv.port}", "--watch",
                    "--interval", "0.2", "--total-steps", "200"], stdout=t.slave,
                   stderr=subprocess.PIPE)
    t.start()
    try:
        wait_for(lambda: "[##########----------]  50%" in t.text(), timeout=20,
                 what="the first frame with rank 0 at 50%")
        out = t.text()
        assert out.startswith(ALT_ON)  # the alternate screen, drawn from its top left
        assert "\033[H" in out and "\033[K" in out
        assert re.search(r"every 0\.2s: cddpctl status 127\.0\.0\.1:\d+ ", out)
        assert "LAST PROGRESS  PROGRESS" in out
        assert "[#####---------------]  25%" in out  # rank 1
        srv.cmd('progress 0 {"step":150}')
        wait_for(lambda: "[###############-----]  75%" in t.text(), timeout=20,
                 what="a later frame with rank 0 at 75%")
        # Frames are redrawn, not appended: each begins at the top left.
        assert t.text().count("\033[H") >= 2
        assert "\n---" not in t.text()
        p.signal(signal.SIGINT)
        assert p.wait(20) == 0
    finally:
        t.close()
    out = t.text()
    # Back on the normal screen, the last frame left there, the cursor shown.
    assert ALT_OFF in out and "\033[?25h" in out
    after = out.split(ALT_OFF)[-1]
    assert "75%" in after and "\033[H" not in after
    err = p.err.strip().splitlines()
    assert len(err) == 1 and "K2001" in err[0], p.err
    assert re.search(r"stopped watching 127\.0\.0\.1:\d+ after \d+ snapshots \(Interrupt\)", err[0])


def test_watch_plain_snapshots_and_json_lines(background):
    srv = StatusServer(background)
    srv.cmd("state running")
    target = f"127.0.0.1:{srv.port}"
    r = cddpctl("status", target, "--watch", "-n", "0.2", "--count", "3")
    assert r.returncode == 0, r.stderr
    assert "\033" not in r.stdout  # not a terminal: no escape codes
    heads = re.findall(rf"^--- \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d {re.escape(target)}$", r.stdout,
                       re.M)
    assert len(heads) == 3
    assert len(re.findall(r"^state +running \(ready\)$", r.stdout, re.M)) == 3
    assert "PROGRESS" not in r.stdout.replace("LAST PROGRESS", "")  # no total: no bars
    assert r.stderr == ""
    r = cddpctl("status", target, "--watch", "--json", "--interval=0.2", "--count=2")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(json.loads(x)["state"] == "running" for x in lines)


@pytest.mark.parametrize("last,code", [("succeeded", 0), ("running", 1)])
def test_watch_ends_when_the_agent_goes_away(background, last, code):
    srv = StatusServer(background)
    srv.cmd(f"state {last}")
    p = background([binary("cddpctl"), "status", f"127.0.0.1:{srv.port}", "--watch",
                    "--interval", "0.2"])
    wait_for(lambda: srv.stats()["requests"] >= 2, timeout=20, what="two snapshots")
    srv.quit()
    assert p.wait(20) == code
    assert re.search(rf"^state +{last} ", p.out, re.M)
    err = p.err.strip().splitlines()
    assert len(err) == 1 and "K2002" in err[0], p.err
    assert f"127.0.0.1:{srv.port} went away (cannot connect to" in err[0]
    assert f"last state {last}" in err[0]
    assert ("the outcome is not known" in err[0]) == (code != 0)


def test_watch_a_port_that_is_not_there_fails_at_once():
    port = free_port()
    r = cddpctl("status", f"127.0.0.1:{port}", "--watch")
    assert r.returncode == 2 and r.stdout == ""
    one_error_line(r, "K0003", "Connection refused")


def test_health_json(background):
    srv = StatusServer(background)
    target = f"127.0.0.1:{srv.port}"
    r = cddpctl("health", target, "--json")
    assert r.returncode == 1 and r.stdout.count("\n") == 1
    h = json.loads(r.stdout)
    assert (h["target"], h["endpoint"], h["ok"], h["http_status"]) == (target, "/readyz", False,
                                                                        503)
    checks = {c["name"]: c for c in h["checks"]}
    assert checks["loop"] == {"name": "loop", "ok": True, "reason": None}
    assert checks["rendezvous"]["ok"] is False
    assert checks["rendezvous"]["reason"] == "agent state: rendezvous, no round yet"
    srv.cmd("state running")
    r = cddpctl("health", target, "--json", "--live")
    h = json.loads(r.stdout)
    assert r.returncode == 0 and (h["endpoint"], h["ok"]) == ("/livez", True)


# ---- job -------------------------------------------------------------------

def test_job_through_the_server_and_every_agent(background):
    """A rendezvous server's view (status_testserver --kind rdzv) with nodes
    named as cddprun's agents name themselves and as host:port, and an agent
    (status_testserver) on each node's loopback address, one port for all."""
    rz = StatusServer(background, "--kind", "rdzv")
    port = free_port()
    nodes = {"r0000000_127.0.0.2_4242": "127.0.0.2", "127.0.0.3_777_0": "127.0.0.3",
             "127.0.0.4:40000": "127.0.0.4"}
    for name in nodes:
        rz.cmd(f"join job7 {name}")
    rz.cmd("wait job7 127.0.0.5_1_0")  # no agent there
    rz.cmd("join other 10.0.0.9:1")
    agents = []
    for i, addr in enumerate(nodes.values()):
        a = StatusServer(background, "--addr", addr, "--port", str(port), "--workers", "2")
        a.cmd("state running")
        a.cmd(f'progress 0 {{"step":{10 * (i + 1)},"loss":1.5}}')
        a.cmd(f'progress 1 {{"step":{10 * (i + 1)}}}')
        agents.append(a)
    target = f"127.0.0.1:{rz.port}"

    # The server's view alone.
    r = cddpctl("job", target, "job7")
    assert r.returncode == 0, r.stderr
    assert re.search(rf"^run job7 on {re.escape(target)}: joining, round 3, 4 nodes "
                     r"\(min:max 1:4\)", r.stdout, re.M), r.stdout
    assert re.search(r"^127\.0\.0\.3_777_0 +- +1 +4 +", r.stdout, re.M)  # no state: "-"
    assert re.search(r"^127\.0\.0\.5_1_0 +waiting +- +4 ", r.stdout, re.M)
    assert "--agent-port PORT asks each node's agent" in r.stdout
    assert "other" not in r.stdout and "10.0.0.9" not in r.stdout

    # And every agent: the workers of the whole job.
    r = cddpctl("job", target, "job7", "--agent-port", str(port), "--total-steps", "40")
    assert r.returncode == 0, r.stderr
    for i, addr in enumerate(nodes.values()):
        assert re.search(rf" {re.escape(addr)}:{port} running$", r.stdout, re.M), r.stdout
        rows = re.findall(rf"^{re.escape(addr)}:{port} +(\d+) +(\d+) +\d+ +running .*$",
                          r.stdout, re.M)
        assert [lr for _, lr in rows] == ["0", "1"], r.stdout
    assert "[#####---------------]  25%" in r.stdout  # 10 of 40
    assert "[##########----------]  50%" in r.stdout
    assert re.search(rf"^127\.0\.0\.5:{port} +- +- +- +unknown", r.stdout, re.M)
    assert re.search(rf"^127\.0\.0\.5_1_0: cannot connect to 127\.0\.0\.5:{port}", r.stdout, re.M)

    # --json: stable keys, the agents' /status as served.
    r = cddpctl("job", target, "job7", "--agent-port", str(port), "--json")
    assert r.returncode == 0 and r.stdout.count("\n") == 1
    j = json.loads(r.stdout)
    assert list(j) == ["run_id", "rdzv", "state", "round", "min_nodes", "max_nodes",
                       "last_round_at", "nodes"]
    assert (j["run_id"], j["rdzv"], j["state"], j["round"]) == ("job7", target, "joining", 3)
    assert [n["node"] for n in j["nodes"]] == [*nodes, "127.0.0.5_1_0"]
    n0 = j["nodes"][0]
    assert list(n0) == ["node", "state", "node_rank", "nproc", "joined_at", "last_seen_at",
                        "waiting", "agent", "agent_error", "status"]
    assert (n0["agent"], n0["agent_error"], n0["status"]["kind"]) == (f"127.0.0.2:{port}", None,
                                                                      "agent")
    assert [w["progress"]["step"] for w in n0["status"]["workers"]] == [10, 10]
    last = j["nodes"][-1]
    assert (last["waiting"], last["node_rank"], last["status"]) == (True, None, None)
    assert "Connection refused" in last["agent_error"]
    r = cddpctl("job", target, "job7", "--json")
    assert all(n["agent"] is None and n["status"] is None for n in json.loads(r.stdout)["nodes"])

    # A run the server does not hold; an agent's port that hosts no server.
    r = cddpctl("job", target, "nope")
    assert r.returncode == 1 and r.stdout == ""
    one_error_line(r, "K2003", f"{target}: no run 'nope' on it (runs: job7 other)")
    r = cddpctl("job", f"127.0.0.2:{port}", "job7")
    assert r.returncode == 1
    one_error_line(r, "K2003", "an agent that does not host the rendezvous server")


def test_job_watch_ends_when_the_server_goes_away(background):
    rz = StatusServer(background, "--kind", "rdzv")
    rz.cmd("join job7 127.0.0.2:1")
    r = cddpctl("job", f"127.0.0.1:{rz.port}", "job7", "--watch", "--count", "2", "-n", "0.2")
    assert r.returncode == 0 and r.stdout.count("run job7 on") == 2
    p = background([binary("cddpctl"), "job", f"127.0.0.1:{rz.port}", "job7", "--watch",
                    "--json", "-n", "0.2"])
    wait_for(lambda: rz.stats()["requests"] >= 3, timeout=20, what="a snapshot")
    rz.quit()
    assert p.wait(20) == 1
    assert json.loads(p.out.splitlines()[0])["run_id"] == "job7"
    assert "K2002" in p.err and "went away" in p.err


@pytest.mark.parametrize("args,needle", [
    (["job", "h:1"], "no RUN_ID given"),
    (["job"], "no RDZV_HOST:PORT RUN_ID given"),
    (["job", "h:1", "r", "x"], "unexpected argument 'x'"),
    (["status", "h:1", "--agent-port", "8080"], "--agent-port is an option of job"),
    (["job", "h:1", "r", "--agent-port", "0"], "--agent-port '0' is not a port"),
    (["status", "h:1", "--interval", "1"], "--interval and --count go with --watch"),
    (["status", "h:1", "--watch", "--interval", "0"], "--interval '0'"),
    (["status", "h:1", "--watch", "--count", "0"], "--count '0'"),
    (["status", "h:1", "--total-steps", "x"], "--total-steps 'x'"),
    (["health", "h:1", "--total-steps", "5"], "--total-steps is an option of status and job"),
    (["status", "h:1", "--watch", "--interval"], "--interval needs"),
])
def test_usage_errors_of_the_new_options(args, needle):
    r = cddpctl(*args)
    assert r.returncode == 2 and r.stdout == ""
    one_error_line(r, "K0001", needle)


# ---- against real cddprun agents and their rendezvous ----------------------

# Reports three steps of 30, a step each 0.3 s, then exits 0.
PROGRESS_WORKER = r"""#!/bin/sh
for s in 10 20 30; do
  printf '{"step":%d,"loss":1.0}\n' "$s" >&"$CDDP_PROGRESS_FD"
  sleep 0.3
done
"""


def test_job_of_real_agents_through_the_hosted_server(cluster):
    """Two real agents (c10d, the first hosts the rendezvous server): job lists
    both nodes of the run as the server knows them and, through the status
    port each agent told the server, every worker of the job."""
    from test_status_multinode import release, worker_script
    port, sport, sport1 = free_port(), free_port(), free_port()
    w = worker_script(cluster)
    cluster.agent("0", *c10d(port, 2, conf="is_host=1," + FAST, status_port=sport), script=w)
    cluster.agent("1", *c10d(port, 2, conf="is_host=0," + FAST, status_port=sport1), script=w)

    def both_active():
        r = cddpctl("job", f"127.0.0.1:{sport}", "job", "--json")
        if r.returncode != 0:
            return None
        j = json.loads(r.stdout)
        return j if [n["state"] for n in j["nodes"]] == ["active", "active"] else None
    j = wait_for(both_active, timeout=30, what="both nodes active on the hosted server")
    assert (j["state"], j["round"], j["min_nodes"], j["max_nodes"]) == ("running", 1, 2, 2)
    assert sorted(n["node_rank"] for n in j["nodes"]) == [0, 1]
    assert all(re.fullmatch(r".+_\d+_0", n["node"]) and n["nproc"] == 2 for n in j["nodes"])
    # Each agent told the server its --status_port when it joined: job
    # asks every agent without --agent-port, where its connection comes from.
    assert sorted(n["agent"] for n in j["nodes"]) == sorted(
        [f"127.0.0.1:{sport}", f"127.0.0.1:{sport1}"]), j["nodes"]
    for n in j["nodes"]:
        assert n["agent_error"] is None and n["status"]["run_id"] == "job", n
        assert len(n["status"]["workers"]) == 2
    r = cddpctl("job", f"127.0.0.1:{sport}", "job")
    assert r.returncode == 0
    assert re.search(r"^run job on 127\.0\.0\.1:\d+: running, round 1, 2 nodes \(min:max 2:2\)",
                     r.stdout, re.M), r.stdout
    assert len(re.findall(r"^\S+_\d+_0 +active +[01] +2 ", r.stdout, re.M)) == 2
    # ... and lists the four workers of the job, two per node.
    assert len(re.findall(r"^127\.0\.0\.1:\d+ +[0-3] +[01] +\d+ ", r.stdout, re.M)) == 4, r.stdout
    assert "--agent-port PORT asks" not in r.stdout
    release(cluster, "0")
    release(cluster, "1")
    assert all(a.wait() == 0 for a in cluster.agents)


def test_watch_a_real_run_to_its_end(background, tmp_path):
    """cddpctl status --watch follows a real cddprun run (progress from its
    workers) until the agent exits after --status_linger; the last state seen
    is succeeded, so the watch exits 0. Then job --agent-port on a hosting
    agent reaches that agent through its node id's host name."""
    w = tmp_path / "worker.sh"
    w.write_text(PROGRESS_WORKER)
    w.chmod(0o755)
    sport = free_port()
    agent = background([binary("cddprun"), "--nproc_per_node=2", f"--status_port={sport}",
                        f"--master_port={free_port()}", "--status_linger=1.5", "--rdzv_id=w1", str(w)])

    def listening():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", sport)) == 0

    # The watch starts once the port is up: a refused first connection is
    # an error for cddpctl, on purpose (a typo in HOST:PORT must not wait).
    wait_for(listening, timeout=30, what="cddprun's status port")
    watch = background([binary("cddpctl"), "status", f"127.0.0.1:{sport}", "--watch", "-n",
                        "0.25", "--total-steps", "30"])
    assert agent.wait(60) == 0, agent.err
    assert watch.wait(30) == 0, watch.err
    assert re.search(r"^state +succeeded ", watch.out, re.M)
    assert "[####################] 100%" in watch.out
    assert "K2002" in watch.err and "last state succeeded" in watch.err


def test_job_agent_port_reaches_the_hosting_agent(background, tmp_path):
    fqdn = socket.getfqdn()
    try:
        addr = socket.gethostbyname(fqdn)
    except OSError:
        pytest.skip(f"this machine's name {fqdn} does not resolve")
    if not addr.startswith("127."):
        pytest.skip(f"this machine's name {fqdn} is {addr}, not loopback (tests stay on loopback)")
    w = tmp_path / "worker.sh"
    w.write_text("#!/bin/sh\nprintf '{\"step\":5}\\n' >&3\nwhile [ ! -e \"$0.done\" ]; do sleep 0.05; done\n")
    w.chmod(0o755)
    port, sport = free_port(), free_port()
    agent = background([binary("cddprun"),
                        *c10d(port, 1, conf="is_host=1," + FAST, status_port=sport), str(w)])
    target = f"127.0.0.1:{sport}"

    def workers_reported():
        r = cddpctl("job", target, "job", "--agent-port", str(sport), "--json")
        if r.returncode != 0:
            return None
        nodes = json.loads(r.stdout)["nodes"]
        ok = nodes and nodes[0]["status"] and all(
            x["progress"] and x["progress"]["step"] == 5 for x in nodes[0]["status"]["workers"])
        return nodes if ok else None
    (node,) = wait_for(workers_reported, timeout=30, what="the agent's workers through job")
    assert node["agent"] == f"{fqdn}:{sport}" and node["agent_error"] is None
    assert node["status"]["run_id"] == "job" and len(node["status"]["workers"]) == 2
    (tmp_path / "worker.sh.done").write_text("")
    assert agent.wait(60) == 0


# ---- what a server sends is data: escaped before it reaches a terminal ------

ESCAPES = "\x1b[31mRED\x1b]0;pwned\x07\x1b[2J"
ESCAPED = r"\x1b[31mRED\x1b]0;pwned\x07\x1b[2J"


def raw_cddpctl(*args):
    """cddpctl with stdout and stderr as bytes: a raw control byte, or one
    that is not UTF-8, must be seen as it was written."""
    return run([binary("cddpctl"), *args], timeout=30, text=False)


def no_controls(data):
    """UTF-8 without a control character but newline and tab: no other C0,
    no DEL, no C1 (U+0080..U+009F)."""
    text = data.decode("utf-8")  # cddpctl writes UTF-8 only
    return not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in text)


def test_a_status_ports_escape_sequences_are_printed_escaped(background):
    """A real status port (status_testserver) whose host name and run id
    hold escape sequences: the table shows them as \\x1b..., never raw; the
    JSON keeps them, JSON-escaped, so a parser gets what was served."""
    srv = StatusServer(background, "--workers", "1")
    srv.cmd("state running")
    srv.cmd(f"hostname evil{ESCAPES}host")
    srv.cmd(f"run_id job{ESCAPES}7")
    target = f"127.0.0.1:{srv.port}"
    r = raw_cddpctl("status", target)
    assert r.returncode == 0, r.stderr
    assert no_controls(r.stdout), r.stdout
    out = r.stdout.decode()
    assert f" on evil{ESCAPED}host (pid " in out.splitlines()[0]
    assert re.search(rf"^run +job{re.escape(ESCAPED)}7$", out, re.M), out
    r = raw_cddpctl("status", target, "--json")
    assert r.returncode == 0 and no_controls(r.stdout)
    served = json.loads(r.stdout)
    assert served["hostname"] == f"evil{ESCAPES}host" and served["run_id"] == f"job{ESCAPES}7"
    # The same through --watch on a pipe.
    r = raw_cddpctl("status", target, "--watch", "--count", "1")
    assert r.returncode == 0 and no_controls(r.stdout) and ESCAPED.encode() in r.stdout


def test_other_servers_strings_are_escaped_everywhere(other_server):
    """A server that sends what a cddp status port never would: control
    characters raw inside JSON strings and between tokens, a newline in a
    field (a forged line), C1 controls and DEL, bytes that are not UTF-8;
    in tables, JSON, health reports and error messages alike."""
    target = f"127.0.0.1:{other_server.server_address[1]}"
    agent = (b'{"kind":"agent","program":"cddprun","hostname":"a\nstate     running (ready)",'
             b'\x1b"state":"failed\x1b[1A","run_id":"r\xc2\x9b31m\x7f\xff",'
             b'"workers":[{"local_rank":0,"state":"run\tning\r"}]}')
    _Handler.replies = {"/status": (200, "application/json", agent)}
    r = raw_cddpctl("status", target)
    assert r.returncode == 0, r.stderr
    assert no_controls(r.stdout), r.stdout
    out = r.stdout.decode()
    assert out.splitlines()[0].endswith(r"on a\x0astate     running (ready) (pid 0), up -")
    assert re.findall(r"^state .*$", out, re.M) == [r"state     failed\x1b[1A (not ready)"]
    assert re.search(r"^run +r\\xc2\\x9b31m\\x7f\\xff$", out, re.M), out
    assert r"run\x09ning\x0d" in out
    r = raw_cddpctl("status", target, "--json")
    assert r.returncode == 0 and no_controls(r.stdout), r.stdout
    j = json.loads(r.stdout)
    assert j["hostname"] == "a\nstate     running (ready)" and j["state"] == "failed\x1b[1A"
    assert j["run_id"] == "r\x9b31m\x7f\ufffd"
    # An unknown kind is shown as JSON, escaped the same way.
    _Handler.replies = {"/status": (200, "application/json", b'{"kind":"x\x1b[H","y":"\xc2\x85"}')}
    r = raw_cddpctl("status", target)
    assert r.returncode == 0 and no_controls(r.stdout), r.stdout
    # An error's text, from the body, on stderr.
    _Handler.replies = {"/status": (503, "application/json", b'{"error":"boom\x1b[2J\\u001b]0;t\\u0007"}')}
    r = raw_cddpctl("status", target)
    assert r.returncode == 1 and no_controls(r.stderr), r.stderr
    assert r"answered HTTP 503: boom\x1b[2J\x1b]0;t\x07" in r.stderr.decode()
    # health's report lines, failed and --verbose.
    _Handler.replies = {"/readyz": (503, "text/plain", b"[+]loop ok\n[-]evil\x1b[2J failed: x\x07\n")}
    for args in ([], ["--verbose"]):
        r = raw_cddpctl("health", target, *args)
        assert r.returncode == 1 and no_controls(r.stdout), r.stdout
        assert rb"  [-]evil\x1b[2J failed: x\x07" in r.stdout
    _Handler.replies = {"/readyz": (200, "text/plain", b"[+]ok\x1b[5m\n")}
    r = raw_cddpctl("health", target, "--verbose")
    assert r.returncode == 0 and no_controls(r.stdout) and rb"[+]ok\x1b[5m" in r.stdout
    r = raw_cddpctl("health", target, "--json")
    assert r.returncode == 0 and no_controls(r.stdout)
    assert json.loads(r.stdout)["checks"][0]["name"] == "ok\x1b[5m"


def test_a_rendezvous_servers_node_ids_are_escaped(background):
    """job and status of a rendezvous server whose run and node ids hold
    escape sequences (status_testserver --kind rdzv)."""
    rz = StatusServer(background, "--kind", "rdzv")
    rz.cmd(f"join job{ESCAPES} node{ESCAPES}_1_0")
    target = f"127.0.0.1:{rz.port}"
    r = raw_cddpctl("status", target)
    assert r.returncode == 0 and no_controls(r.stdout), r.stdout
    assert f"node{ESCAPED}_1_0".encode() in r.stdout
    r = raw_cddpctl("job", target, f"job{ESCAPES}", "--agent-port", str(free_port()))
    assert r.returncode == 0 and no_controls(r.stdout), r.stdout
    assert f"run job{ESCAPED} on".encode() in r.stdout
    assert f"node{ESCAPED}_1_0".encode() in r.stdout
    r = raw_cddpctl("job", target, "other")
    assert r.returncode == 1 and no_controls(r.stderr)
    assert f"(runs: job{ESCAPED})".encode() in r.stderr
