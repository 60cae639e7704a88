"""cddp-rdzv's status port end to end: the real daemon with real agents
(rdzv-load, the agent's own rendezvous client) and misbehaving peers
(rdzv_wire.py), fetched with curl and cddpctl and the strict metrics
parser: a run forming, its round, the wait list, refused connections by
reason, coalesced publishing, shutdown, flags and their errors.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

import promparse
from conftest import binary, free_port, port_is_closed, run, wait_for
from rdzv_wire import Peer, frame
from statusserver import cddpctl, curl, get_json
from test_rdzv import Procs

PROM_CTYPE = "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture
def rz(background):
    procs = Procs(background)
    yield procs
    procs.check()


def metrics(port):
    code, headers, body = curl(f"http://127.0.0.1:{port}/metrics")
    assert code == 200 and headers["content-type"] == PROM_CTYPE
    return promparse.parse(body.decode(), conventions=True)


def status_of(port):
    return get_json(f"http://127.0.0.1:{port}/status")


def wait_status(port, pred, what, timeout=20):
    def ok():
        st = status_of(port)
        return st if pred(st) else None
    return wait_for(ok, timeout=timeout, what=what)


def run_of(st, run_id):
    return next((r for r in st["runs"] if r["run_id"] == run_id), None)


def test_runs_rounds_wait_list_and_refusals(rz):
    sport = free_port()
    d = rz.daemon(f"--status-port={sport}", env=dict(os.environ, CDDP_RDZV_TOKEN="s3cret"))
    base, target = f"http://127.0.0.1:{sport}", f"127.0.0.1:{sport}"

    # ---- nothing yet: serving, ready, no runs ----
    st = status_of(sport)
    assert (st["kind"], st["program"], st["ready"], st["runs"]) == ("rdzv", "cddp-rdzv", True, [])
    assert st["endpoint"] == f"127.0.0.1:{d.port}"
    assert st["connections"] == 0 and st["joins_total"] == 0
    for path in ("/livez", "/healthz", "/readyz"):
        assert curl(base + path)[::2] == (200, b"ok\n"), path
    assert curl(base + "/readyz?verbose")[2] == b"[+]loop ok\n[+]listener ok\nreadyz check passed\n"
    m = metrics(sport)
    assert promparse.value(m, "cddp_rdzv_ready") == 1
    assert promparse.value(m, "cddp_rdzv_runs") == 0
    assert promparse.value(m, "cddp_build_info", program="cddp-rdzv") == 1

    # ---- one agent: the run forms ----
    a = rz.agent(d, run_id="job7", min_nodes=2, max_nodes=2, nproc=4, token="s3cret")
    st = wait_status(sport, lambda s: run_of(s, "job7") and run_of(s, "job7")["members"],
                     "the first join")
    r = run_of(st, "job7")
    assert (r["state"], r["min_nodes"], r["max_nodes"], r["last_round_at"]) == (
        "forming", 2, 2, None)
    (n0,) = r["members"]
    assert (n0["state"], n0["node_rank"], n0["nproc"]) == ("participant", None, 4)
    assert n0["joined_at"] >= st["started_at"] and n0["last_seen_at"] >= n0["joined_at"]
    assert st["connections"] == 1 and st["joins_total"] == 1

    # ---- a second: the round completes ----
    b = rz.agent(d, run_id="job7", min_nodes=2, max_nodes=2, nproc=4, token="s3cret")
    rounds = [a.expect("round"), b.expect("round")]
    st = wait_status(sport, lambda s: run_of(s, "job7")["state"] == "running", "the round")
    r = run_of(st, "job7")
    assert r["round"] == rounds[0]["round"] and r["last_round_at"] >= n0["joined_at"]
    assert sorted(n["node_rank"] for n in r["members"]) == [0, 1]
    assert {n["state"] for n in r["members"]} == {"active"}
    assert st["rounds_total"] == 1 and st["joins_total"] == 2

    # ---- a third: on the wait list (the round is at max_nodes) ----
    c = rz.agent(d, run_id="job7", min_nodes=2, max_nodes=2, nproc=4, token="s3cret")
    c.expect("waiting")
    st = wait_status(sport, lambda s: run_of(s, "job7")["waiting"], "the wait list")
    (w,) = run_of(st, "job7")["waiting"]
    assert (w["state"], w["node_rank"], w["nproc"]) == ("waiting", None, 4)
    m = metrics(sport)
    assert promparse.value(m, "cddp_rdzv_members", run_id="job7") == 2
    assert promparse.value(m, "cddp_rdzv_waiting_nodes", run_id="job7") == 1
    assert promparse.value(m, "cddp_rdzv_round", run_id="job7") == r["round"]
    assert promparse.value(m, "cddp_rdzv_connections") == 3
    assert promparse.value(m, "cddp_rdzv_joins_total") == 3

    # ---- refused: a wrong token, then garbage ----
    with Peer("127.0.0.1", d.port) as p:
        assert p.hello("job7", token="wrong")["type"] == "error"
        assert p.closed_by_peer()
    with Peer("127.0.0.1", d.port) as p:
        p.send_raw(frame({"v": 1, "type": "no_such_message"}))
        assert p.closed_by_peer()
    st = wait_status(sport, lambda s: s["refused_connections"]["protocol"] == 1,
                     "the refusals")
    assert st["refused_connections"] == {"limit": 0, "token": 1, "protocol": 1}
    assert st["connections_total"] == 5
    m = metrics(sport)
    assert promparse.value(m, "cddp_rdzv_refused_connections_total", reason="token") == 1
    assert promparse.value(m, "cddp_rdzv_refused_connections_total", reason="protocol") == 1

    # ---- cddpctl reads it ----
    r = cddpctl("status", target)
    assert r.returncode == 0, r.stderr
    assert re.search(rf"^endpoint +127\.0\.0\.1:{d.port} \(accepting agents\)$", r.stdout, re.M)
    assert re.search(r"^job7 +running +\d+ +2 +2:2 +1 ", r.stdout, re.M), r.stdout
    assert re.search(r"^job7 +\S+ +waiting +4 ", r.stdout, re.M), r.stdout
    assert json.loads(cddpctl("status", target, "--json").stdout)["kind"] == "rdzv"
    assert cddpctl("health", target).returncode == 0

    # ---- bad requests never bother the rendezvous ----
    assert curl(base + "/nope")[0] == 404
    assert curl(base + "/status", "-X", "DELETE")[0] == 405

    # ---- SIGTERM: agents told, the port closed ----
    d.p.signal(signal.SIGTERM)
    for ag in (a, b):  # the round's members are told why
        assert "SIGTERM" in ag.expect("closed")["reason"]
    assert d.p.wait(20) == 0
    assert port_is_closed(sport)
    assert cddpctl("health", target).returncode == 2


def test_heartbeats_are_coalesced(rz):
    """30 agents beating every 50 ms (600 events a second) cost the server a
    few snapshots a second, not one per event; the last_seen times move."""
    sport = free_port()
    d = rz.daemon(f"--status_port={sport}")
    rz.agent(d, run_id="beat", min_nodes=30, max_nodes=30, conf="keep_alive_interval=0.05")
    load = subprocess.Popen([binary("rdzv-load"), "--stay", "--agents", "29", "--host", d.host,
                             "--port", str(d.port), "--run-id", "beat", "--min", "30", "--max",
                             "30", "--conf", "keep_alive_interval=0.05"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        st = wait_status(sport, lambda s: run_of(s, "beat") and
                         run_of(s, "beat")["state"] == "running", "the 30-node round")
        seen0 = max(n["last_seen_at"] for n in run_of(st, "beat")["members"])
        before = promparse.value(metrics(sport), "cddp_status_snapshots_published_total")
        t0 = time.monotonic()
        time.sleep(2.0)  # the quantity measured is what happens in this interval
        after = promparse.value(metrics(sport), "cddp_status_snapshots_published_total")
        elapsed = time.monotonic() - t0
        st = status_of(sport)
        seen1 = max(n["last_seen_at"] for n in run_of(st, "beat")["members"])
        assert seen1 > seen0 + 1.0  # heartbeats kept arriving (about 1200 events)
        assert after - before <= 5 * elapsed + 3, (after - before, elapsed)
    finally:
        load.terminate()
        load.wait(10)


def test_status_flags_and_errors(rz):
    exe = binary("cddp-rdzv")
    for args, env, what in (
            (["--status-port", "http"], {}, "--status-port: 'http' is not a port number"),
            (["--status_port=70000"], {}, "--status-port: '70000'"),
            ([], {"CDDP_STATUS_PORT": "x"}, "CDDP_STATUS_PORT: 'x'"),
            (["--status-port=0", "--status-addr=no-such-host.invalid"], {},
             "status address 'no-such-host.invalid'")):
        r = run([exe, "--port", "0", *args], env=dict(os.environ, **env), timeout=10)
        assert r.returncode == 2, (args, r.stderr)
        assert what in r.stderr and r.stderr.startswith("cddp-rdzv: "), (args, r.stderr)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run([exe, "--port", "0", f"--status-port={port}"], timeout=10)
        assert r.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr
        assert r.stdout == ""  # it never served agents
    # CDDP_STATUS_PORT alone turns it on; the connection limit is a refusal reason.
    sport = free_port()
    d = rz.daemon("--max-connections", "1", env=dict(os.environ, CDDP_STATUS_PORT=str(sport)))
    with Peer("127.0.0.1", d.port) as p1:
        assert p1.hello("x")["type"] == "welcome"
        with Peer("127.0.0.1", d.port) as p2:
            assert p2.closed_by_peer()
        st = wait_status(sport, lambda s: s["refused_connections"]["limit"] == 1, "the refusal")
        assert st["refused_connections"] == {"limit": 1, "token": 0, "protocol": 0}
