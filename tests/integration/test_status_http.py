"""The status port (status/http.c) as a real server on loopback, driven
through tests/helpers/status_testserver and fetched with real clients: curl,
http.client and raw sockets. The same module serves cddprun and cddp-rdzv;
their end-to-end runs are tested with those programs."""
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

import promparse
from conftest import binary, free_port, wait_for
from statusserver import StatusServer, curl, get_json, progress_snippet

PROM_CTYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics(srv):
    code, headers, body = curl(srv.base + "/metrics")
    assert code == 200
    assert headers["content-type"] == PROM_CTYPE
    return promparse.parse(body, conventions=True)


def code_of(url, *args):
    return curl(url, *args)[0]


def test_endpoints_through_a_run(background):
    """Each endpoint and status code as the agent goes from nothing published
    through rendezvous, running, a failure and restart, to failed and success."""
    srv = StatusServer(background, "--no-publish", "--workers", "2")
    # Nothing published yet: alive, not ready, no status.
    assert code_of(srv.base + "/livez") == 200
    code, _, body = curl(srv.base + "/readyz?verbose")
    assert code == 503 and b"[-]snapshot failed: no status published yet" in body
    code, headers, body = curl(srv.base + "/status")
    assert code == 503 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": "no status published yet"}
    assert "cddp_status_snapshot_age_seconds" in metrics(srv)

    def expect(state, ready):
        st = get_json(srv.base + "/status")
        assert st["state"] == state and st["ready"] is ready
        assert code_of(srv.base + "/readyz") == (200 if ready else 503)
        assert code_of(srv.base + "/livez") == 200
        m = metrics(srv)
        assert promparse.value(m, "cddp_agent_state", state=state) == 1
        assert sum(s.value for s in m["cddp_agent_state"].samples) == 1
        assert promparse.value(m, "cddp_agent_ready") == (1 if ready else 0)
        return st, m

    srv.cmd("publish")
    st, _ = expect("rendezvous", False)
    assert st["round"] == 0 and st["node_rank"] is None
    assert [w["state"] for w in st["workers"]] == ["init", "init"]
    code, _, body = curl(srv.base + "/readyz?verbose")
    assert b"[+]loop ok\n" in body
    assert b"[-]rendezvous failed: agent state: rendezvous, no round yet\n" in body
    assert b"[-]workers failed" in body and body.endswith(b"readyz check failed\n")

    srv.cmd("state running")
    st, m = expect("running", True)
    assert st["round"] == 1 and [w["pid"] for w in st["workers"]] == [10000, 10001]
    assert promparse.value(m, "cddp_agent_workers", state="running") == 2
    code, _, body = curl(srv.base + "/readyz")
    assert body == b"ok\n"

    # Worker 1 is killed; the agent restarts the group (one restart used).
    srv.cmd("exit 1 SIGKILL")
    srv.cmd("restart worker_failure")
    srv.cmd("state restarting")
    st, m = expect("restarting", False)
    w1 = st["workers"][1]
    assert (w1["state"], w1["signal"], w1["signal_name"], w1["exit_code"]) == (
        "failed", 9, "SIGKILL", None)
    assert w1["exited_at"] >= w1["started_at"] > 0
    assert st["workers"][0]["exited_at"] is None
    assert st["restarts"] == {"count": 1, "max": 3, "remaining": 2,
                              "by_reason": {"worker_failure": 1, "membership_change": 0}}
    assert promparse.value(m, "cddp_agent_restarts_total", reason="worker_failure") == 1
    assert promparse.value(m, "cddp_agent_worker_exits_total", reason="signal") == 1
    assert promparse.value(m, "cddp_agent_worker_exits_total", reason="stopped") == 1
    code, _, body = curl(srv.base + "/readyz?verbose")
    assert b"[+]rendezvous ok" in body and b"[-]workers failed" in body

    srv.cmd("round 2")
    srv.cmd("state running")
    st, m = expect("running", True)
    assert [w["restarts"] for w in st["workers"]] == [1, 1]
    assert promparse.value(m, "cddp_agent_rdzv_round") == 2

    srv.cmd("exit 0 3")
    srv.cmd("state failed")
    st, m = expect("failed", False)
    assert st["workers"][0]["exit_code"] == 3
    assert promparse.value(m, "cddp_agent_worker_exits_total", reason="failure") == 1

    srv.cmd("state exit_barrier")
    expect("exit_barrier", False)
    srv.cmd("state succeeded")
    expect("succeeded", False)
    srv.cmd("state terminated")
    _, m = expect("terminated", False)
    assert len(m["cddp_agent_state"].samples) == 9
    assert srv.quit() == 0


def test_livez_healthz_and_checks(background):
    srv = StatusServer(background)
    srv.cmd("state running")
    for path in ("/livez", "/healthz"):
        code, headers, body = curl(srv.base + path)
        assert (code, body) == (200, b"ok\n")
        assert headers["content-type"] == "text/plain; charset=utf-8"
        assert headers["cache-control"] == "no-store"
        code, _, body = curl(srv.base + path + "?verbose")
        assert (code, body) == (200, b"[+]loop ok\nlivez check passed\n")
    assert curl(srv.base + "/livez/loop")[:3:2] == (200, b"ok\n")
    assert curl(srv.base + "/readyz/workers")[:3:2] == (200, b"ok\n")
    assert code_of(srv.base + "/readyz/nope") == 404
    assert code_of(srv.base + "/livez/workers") == 404  # a readiness check, not a liveness one
    srv.cmd("state restarting")
    code, _, body = curl(srv.base + "/readyz/workers")
    assert code == 503 and body.startswith(b"[-]workers failed: ")
    assert code_of(srv.base + "/readyz/rendezvous") == 200
    # ?exclude= leaves a failing check out of the verdict (kube-apiserver's way).
    code, _, body = curl(srv.base + "/readyz?exclude=workers&exclude=nope")
    assert code == 200
    assert b"[+]workers excluded: ok\n" in body and b'cannot exclude "nope"' in body
    assert code_of(srv.base + "/readyz?verbose=0") == 503
    index = curl(srv.base + "/")
    assert index[0] == 200 and b"/metrics" in index[2]


def test_wedged_loop_fails_liveness(background):
    srv = StatusServer(background, "--live-timeout", "300")
    srv.cmd("state running")
    srv.cmd("wedge")  # the heartbeat timer stops, as when the loop hangs
    wait_for(lambda: code_of(srv.base + "/livez") == 503, timeout=10, what="/livez 503")
    code, _, body = curl(srv.base + "/livez?verbose")
    assert code == 503 and b"[-]loop failed: the event loop has not turned for" in body
    assert code_of(srv.base + "/healthz") == 503
    # Not ready either: a wedged owner's snapshot cannot be trusted.
    code, _, body = curl(srv.base + "/readyz?verbose")
    assert code == 503 and b"[-]loop failed" in body and b"[+]workers ok" in body
    assert promparse.value(metrics(srv), "cddp_status_loop_heartbeat_age_seconds") > 0.3
    srv.cmd("unwedge")
    wait_for(lambda: code_of(srv.base + "/livez") == 200, timeout=10, what="/livez 200")
    assert code_of(srv.base + "/readyz") == 200


def test_http_thread_serves_while_the_loop_blocks(background):
    """The loop blocks for 4 s: the HTTP thread still answers from the last
    snapshot, and liveness reports the stall."""
    srv = StatusServer(background, "--live-timeout", "300")
    srv.cmd("state running")
    srv.send("block 4000")
    wait_for(lambda: code_of(srv.base + "/livez") == 503, timeout=3, what="/livez 503 while blocked")
    st = get_json(srv.base + "/status")
    assert st["state"] == "running"
    assert srv.lines.empty(), "the loop was not blocked while /status answered"
    assert srv.reply(timeout=15) == "ok block"
    wait_for(lambda: code_of(srv.base + "/livez") == 200, timeout=10, what="/livez 200 again")


def test_methods_head_and_paths(background):
    srv = StatusServer(background)
    code, headers, body = curl(srv.base + "/status")
    code_h, headers_h, body_h = curl(srv.base + "/status", "-I")
    assert (code_h, body_h) == (200, b"")
    assert headers_h["content-length"] == str(len(body)) == headers["content-length"]
    assert headers_h["content-type"] == "application/json"
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"):
        code, headers, _ = curl(srv.base + "/status", "-X", method)
        assert code == 405, method
        assert headers["allow"] == "GET, HEAD"
    code, headers, _ = curl(srv.base + "/status", "-d", "x" * 100000)  # a POST with a body
    assert code == 405
    for path in ("/nope", "/status/", "/metricsx", "/livez/", "/readyz/", "/STATUS", "/status/x"):
        assert code_of(srv.base + path) == 404, path
    assert code_of(srv.base + "/status?pretty=1") == 200  # unknown arguments are ignored


def test_oversized_requests(background):
    srv = StatusServer(background, "--max-header-bytes", "2048", "--max-body-bytes", "100")
    assert code_of(srv.base + "/livez", "-H", "X-Pad: " + "a" * 1500) == 200
    assert code_of(srv.base + "/livez", "-H", "X-Pad: " + "a" * 3000) == 431
    # Far past what libmicrohttpd keeps in memory: it refuses on its own.
    assert code_of(srv.base + "/livez", "-H", "X-Pad: " + "a" * 100000) == 431
    assert code_of(srv.base + "/livez?" + "a" * 100000) in (414, 431)
    # A GET with a body: small is read and ignored, large is refused.
    assert code_of(srv.base + "/livez", "-X", "GET", "-d", "x" * 50) == 200
    assert code_of(srv.base + "/livez", "-X", "GET", "-d", "x" * 500) == 413
    assert code_of(srv.base + "/livez", "-X", "GET", "-H", "Transfer-Encoding: chunked",
                   "-d", "x") == 413
    # Raw: a Content-Length that is not a number.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n")
        assert s.recv(100).split(b" ")[1] in (b"400", b"413")
    assert code_of(srv.base + "/status") == 200


def test_garbage_never_stops_the_server(background):
    srv = StatusServer(background, "--idle-timeout", "2")
    junk = [
        b"\x00\x01\x02\xff\xfe garbage\r\n\r\n",
        b"GET /status HTTP/9.9\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /status HTTP/1.1\r\nNo colon here\r\n\r\n",
        b"GET /status HTTP/1.1\r\n" + b"X: y\r\n" * 5000 + b"\r\n",
        b"G" * 100000 + b" / HTTP/1.1\r\n\r\n",
        b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"GET /%zz%00 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /status HTTP/1.1\r\nHost: x\r\n\r\nGET /status HTTP/1.1\r\n",  # then hang up
    ]
    for data in junk:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
            except OSError:
                pass  # the server may reset a connection it refuses
        assert code_of(srv.base + "/livez") == 200
    # A client that connects and resets at once.
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    assert code_of(srv.base + "/status") == 200
    assert srv.proc.poll() is None


def test_metrics_are_strict_prometheus(background):
    srv = StatusServer(background, "--workers", "3")
    srv.cmd("state running")
    srv.cmd('run_id job"7\\x{y}')
    srv.cmd('progress 0 {"step":120,"epoch":1,"loss":2.31,"samples_per_s":612.5}')
    srv.cmd('progress 1 {"step":7,"loss":NaN}')
    srv.cmd("progress 2 this is not json")
    code, headers, body = curl(srv.base + "/metrics")
    assert headers["content-type"] == PROM_CTYPE
    assert body.endswith(b"\n") and b"\r" not in body
    fams = promparse.parse(body, conventions=True)
    assert promparse.value(fams, "cddp_agent_info", run_id='job"7\\x{y}') == 1
    assert promparse.value(fams, "cddp_worker_progress_step", local_rank="0") == 120
    assert promparse.value(fams, "cddp_worker_samples_per_second", local_rank="0") == 612.5
    assert promparse.value(fams, "cddp_worker_loss", local_rank="0") == 2.31
    assert math.isnan(promparse.value(fams, "cddp_worker_loss", local_rank="1"))
    assert promparse.value(fams, "cddp_worker_progress_malformed_lines_total", local_rank="2") == 1
    with pytest.raises(KeyError):
        promparse.value(fams, "cddp_worker_progress_step", local_rank="2")
    assert promparse.value(fams, "cddp_status_requests_total", code="2xx") >= 0
    # The server's own families come after the owner's, each exactly once.
    names = list(fams)
    assert names.index("cddp_status_connections") > names.index("cddp_worker_loss")

    srv2 = StatusServer(background, "--kind", "rdzv")
    srv2.cmd("join job7 10.0.0.2:1")
    srv2.cmd("join job7 10.0.0.3:1")
    srv2.cmd("wait job7 10.0.0.4:1")
    srv2.cmd('join a"b\\c 10.0.0.9:1')
    fams = metrics(srv2)
    assert promparse.value(fams, "cddp_rdzv_runs") == 2
    assert promparse.value(fams, "cddp_rdzv_members", run_id="job7") == 2
    assert promparse.value(fams, "cddp_rdzv_waiting_nodes", run_id="job7") == 1
    assert promparse.value(fams, "cddp_rdzv_members", run_id='a"b\\c') == 1
    assert promparse.value(fams, "cddp_rdzv_joins_total") == 4


def test_progress_channel_values(background):
    srv = StatusServer(background, "--workers", "2")
    srv.cmd("state running")
    srv.cmd('progress 0 {"step":120,"epoch":1,"loss":2.31,"samples_per_s":612.5}')
    srv.cmd('progress 0 {"step":121}')
    srv.cmd("progress 1 {broken")
    srv.cmd("progress-long 1 5000")  # past PROGRESS_LINE_MAX: dropped whole
    st = get_json(srv.base + "/status")
    p0, p1 = st["workers"][0]["progress"], st["workers"][1]["progress"]
    assert (p0["step"], p0["epoch"], p0["loss"], p0["samples_per_s"]) == (121, 1, 2.31, 612.5)
    assert p0["lines"] == 2 and p0["malformed"] == 0
    assert p0["time"] > st["started_at"] - 1 and p0["age_s"] >= 0
    assert p1["step"] is None and p1["malformed"] == 2 and p1["lines"] == 0
    srv.cmd('progress 0 {"loss":Infinity}')
    assert get_json(srv.base + "/status")["workers"][0]["progress"]["loss"] == "Infinity"
    # A new attempt forgets the values, keeps the counters.
    srv.cmd("state restarting")
    srv.cmd("state running")
    p0 = get_json(srv.base + "/status")["workers"][0]["progress"]
    assert p0["step"] is None and p0["lines"] == 3


def test_connection_limit_and_slow_clients(background):
    """max_connections slow clients fill the server; a new client evicts the
    oldest and is served at once; the rest are cut off after the request
    timeout."""
    srv = StatusServer(background, "--max-connections", "4", "--request-timeout", "3000",
                       "--idle-timeout", "60")
    held = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")  # never finished
        held.append(s)
        wait_for(lambda: srv.stats()["open"] == len(held), timeout=5, what="an open connection")
    t0 = time.monotonic()
    probe = socket.create_connection(("127.0.0.1", srv.port), timeout=15)
    probe.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    reply = b""
    while True:
        chunk = probe.recv(4096)
        if not chunk:
            break
        reply += chunk
    probe.close()
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert time.monotonic() - t0 < 2.5  # before any request timeout cut (3 s)
    # The oldest made room; the others are still there.
    held[0].settimeout(10)
    assert held[0].recv(100) == b""
    held[0].close()
    for s in held[1:]:
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recv(100)
    assert srv.stats()["evicted"] == 1
    assert promparse.value(metrics(srv), "cddp_status_evicted_connections_total") == 1
    # The slow clients are cut off after request_timeout.
    for s in held[1:]:
        s.setblocking(True)
        s.settimeout(10)
        assert s.recv(100) == b""  # closed by the server
        s.close()
    assert srv.stats()["slow_closed"] >= 3
    assert promparse.value(metrics(srv), "cddp_status_slow_clients_closed_total") >= 3


def test_slowloris_is_cut_off_and_others_are_served(background):
    srv = StatusServer(background, "--request-timeout", "1000", "--idle-timeout", "60")
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.settimeout(0.2)
    s.sendall(b"GET /status HTTP/1.1\r\n")
    closed = False
    deadline = time.monotonic() + 15
    sent = 0
    while time.monotonic() < deadline:
        try:
            s.sendall(b"X-%d: y\r\n" % sent)  # one header line every 0.2 s: never idle
            sent += 1
            if s.recv(100) == b"":
                closed = True
                break
        except socket.timeout:
            # Meanwhile the server answers everybody else at once.
            if sent == 2:
                assert code_of(srv.base + "/status") == 200
        except (ConnectionResetError, BrokenPipeError):
            closed = True
            break
    s.close()
    assert closed, "the slow client was never cut off"
    assert sent >= 3
    assert srv.stats()["slow_closed"] >= 1


def test_idle_connection_is_closed(background):
    srv = StatusServer(background, "--idle-timeout", "1", "--request-timeout", "60000")
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=15)
    assert s.recv(100) == b""  # closed by the server, not by the 15 s timeout
    s.close()


def test_keepalive_and_many_concurrent_clients(background):
    """40 clients x 25 keep-alive requests while the loop publishes new
    snapshots: every answer is whole and consistent."""
    srv = StatusServer(background, "--workers", "8", "--max-connections", "64")
    srv.cmd("state running")
    errors = []
    stop = threading.Event()

    def client():
        try:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
            for i in range(25):
                path = ("/status", "/metrics", "/readyz", "/livez")[i % 4]
                c.request("GET", path)
                r = c.getresponse()
                body = r.read()
                if path == "/status":
                    st = json.loads(body)
                    if st["state"] not in ("running", "rendezvous") or len(st["workers"]) != 8:
                        errors.append(f"bad status {st['state']}")
                elif path == "/metrics":
                    promparse.parse(body, conventions=True)
                elif path == "/readyz":
                    if r.status not in (200, 503):
                        errors.append(f"readyz {r.status}")
                elif r.status != 200:
                    errors.append(f"livez {r.status}")
            c.close()
        except Exception as e:  # noqa: BLE001 - report any failure of any client
            errors.append(repr(e))

    def publisher():
        while not stop.is_set():
            srv.cmd("state rendezvous")
            srv.cmd("state running")

    pub = threading.Thread(target=publisher)
    pub.start()
    threads = [threading.Thread(target=client) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    pub.join(30)
    assert not errors, errors[:5]
    st = srv.stats()
    assert st["requests"] >= 40 * 25
    # Keep-alive: far fewer connections than requests.
    assert st["total"] < 40 * 25 / 4
    assert srv.quit() == 0


def test_port_zero_addr_and_errors(background):
    srv = StatusServer(background, "--port", "0")
    assert srv.port > 0 and srv.address == f"127.0.0.1:{srv.port}"
    # The chosen port is logged (WARNING, so it shows at the default level).
    srv.quit()
    assert f"picked free port {srv.port}" in srv.bg.err
    assert "S0001" in srv.bg.err

    port = free_port()
    srv = StatusServer(background, "--port", str(port), "--addr", "0.0.0.0")
    assert srv.address == f"0.0.0.0:{port}"
    assert code_of(f"http://127.0.0.1:{port}/livez") == 200
    # The same port again: one clear line, exit 1, and the first one is fine.
    r = subprocess.run([binary("status_testserver"), "--port", str(port), "--addr", "0.0.0.0"],
                       capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"status_testserver: cannot listen on 0.0.0.0:{port}: "
                                "Address already in use")
    r = subprocess.run([binary("status_testserver"), "--addr", "no-such-host.invalid"],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "no-such-host.invalid" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert code_of(f"http://127.0.0.1:{port}/livez") == 200


def test_ipv6_loopback(background):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    srv = StatusServer(background, "--addr", "::1")
    assert srv.address == f"[::1]:{srv.port}"
    assert code_of(f"http://[::1]:{srv.port}/livez") == 200


def test_signals(background):
    srv = StatusServer(background)
    assert code_of(srv.base + "/readyz") == 503
    srv.bg.signal(signal.SIGUSR1)
    assert srv.reply() == "ok signal running"
    assert code_of(srv.base + "/readyz") == 200
    srv.bg.signal(signal.SIGUSR1)
    assert srv.reply() == "ok signal rendezvous"
    assert code_of(srv.base + "/readyz") == 503
    # SIGTERM: a clean stop, the port is free again at once.
    port = srv.port
    srv.bg.signal(signal.SIGTERM)
    assert srv.bg.wait(10) == 0
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_rdzv_status_and_readiness(background):
    srv = StatusServer(background, "--kind", "rdzv")
    srv.cmd("join job7 10.0.0.2:4000")
    srv.cmd("wait job7 10.0.0.3:4000")
    st = get_json(srv.base + "/status")
    assert st["kind"] == "rdzv" and st["ready"] is True
    run = st["runs"][0]
    assert run["run_id"] == "job7" and run["round"] == 1
    assert [m["node"] for m in run["members"]] == ["10.0.0.2:4000"]
    assert [m["node"] for m in run["waiting"]] == ["10.0.0.3:4000"]
    assert code_of(srv.base + "/readyz") == 200
    srv.cmd("accepting 0")
    code, _, body = curl(srv.base + "/readyz?verbose")
    assert code == 503 and b"[-]listener failed: not accepting agents" in body


def test_stop_with_clients_connected(background):
    """Stopping the server while clients hold connections ends cleanly."""
    srv = StatusServer(background)
    socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(10)]
    for s in socks[:5]:
        s.sendall(b"GET /status HTTP/1.1\r\n")
    wait_for(lambda: srv.stats()["open"] == 10, timeout=5, what="10 connections")
    assert srv.quit() == 0
    for s in socks:
        s.close()
    assert os.path.exists(binary("status_testserver"))


@pytest.mark.torch
@pytest.mark.heavy
def test_documented_progress_snippet(background, torch_python):
    """The documented snippet, run by real PyTorch with a real pipe, writes
    lines the parser takes, NaN loss included; without CDDP_PROGRESS_FD
    (plain torchrun) it does nothing."""
    script = progress_snippet() + (
        "import torch\n"
        "for step in range(3):\n"
        "    loss = torch.tensor(2.5 - step)\n"
        "    report(step=step, epoch=0, loss=loss.item(), samples_per_s=100.0 * (step + 1))\n"
        "report(step=3, loss=torch.tensor(float('nan')).item())\n"
        "print('done')\n")
    r_fd, w_fd = os.pipe()
    env = dict(os.environ, CDDP_PROGRESS_FD=str(w_fd))
    p = subprocess.run([torch_python, "-c", script], pass_fds=(w_fd,), env=env,
                       capture_output=True, text=True, timeout=120)
    os.close(w_fd)
    with os.fdopen(r_fd, "rb") as fh:
        data = fh.read()
    assert p.returncode == 0 and p.stdout == "done\n", p.stderr
    lines = data.decode().splitlines()
    assert len(lines) == 4
    srv = StatusServer(background, "--workers", "1")
    srv.cmd("state running")
    for line in lines:
        srv.cmd("progress 0 " + line)
    prog = get_json(srv.base + "/status")["workers"][0]["progress"]
    assert (prog["step"], prog["epoch"], prog["loss"], prog["samples_per_s"]) == (3, 0, "NaN", 300.0)
    assert prog["lines"] == 4 and prog["malformed"] == 0
    # Not under cddprun: no variable, no output, no error.
    env.pop("CDDP_PROGRESS_FD")
    p = subprocess.run([torch_python, "-c", progress_snippet() + "report(step=1)\nprint('ok')\n"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (0, "ok\n"), p.stderr
