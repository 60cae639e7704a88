"""cddpctl against a real status port (tests/helpers/status_testserver) and
against servers that misbehave: refused, silent, hanging up, not JSON."""
import http.server
import json
import re
import socket
import threading

import pytest

from conftest import free_port, wait_for
from statusserver import StatusServer, cddpctl, curl


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
    assert "  [-]rendezvous failed: agent is rendezvous, no round yet" in r.stdout
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
