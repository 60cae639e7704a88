"""Process tests of the cddp-rdzv daemon over real loopback sockets.

Agents are real processes: `rdzv-load --stay --agents 1` runs the agent's
rendezvous client (rendezvous/client.c) and prints one JSON line per event
(round, restart, waiting, closed, error). Misbehaving peers are played by
tests/integration/rdzv_wire.py, an independent Python implementation of the
wire protocol.
"""
import json
import os
import queue
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from conftest import binary, wait_for
from rdzv_wire import Peer, b64, frame, unb64


class Lines:
    """Reads a process's stdout lines on a thread, so waits can be bounded."""

    def __init__(self, stream):
        self.q = queue.Queue()
        self.seen = []
        t = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        t.start()

    def _pump(self, stream):
        try:
            for line in stream:
                self.q.put(line)
        except ValueError:
            pass  # the fixture closed the pipe at teardown while this thread read it
        self.q.put(None)

    def next(self, timeout):
        try:
            line = self.q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output within {timeout}s (so far: {self.seen})")
        if line is not None:
            self.seen.append(line.rstrip())
        return line


class Daemon:
    def __init__(self, background, *args, env=None, host="127.0.0.1"):
        cmd = [binary("cddp-rdzv"), "--port", "0", *args]
        if host:
            cmd[1:1] = ["--host", host]
        self.p = background(cmd, env=env)
        self.lines = Lines(self.p.proc.stdout)
        first = self.lines.next(10)
        assert first and "listening on" in first, f"cddp-rdzv did not start: {first}"
        self.port = int(first.split()[3].rsplit(":", 1)[1])
        self.host = host or "127.0.0.1"

    def alive(self):
        return self.p.proc.poll() is None

    def peer(self):
        return Peer(self.host, self.port)


class Agent:
    """One agent process (rdzv-load --stay)."""

    def __init__(self, background, daemon, run_id="job", min_nodes=2, max_nodes=2, nproc=1,
                 conf=None, token=None, host=None, port=None, env=None):
        cmd = [binary("rdzv-load"), "--stay", "--agents", "1",
               "--host", host or daemon.host, "--port", str(port or daemon.port),
               "--run-id", run_id, "--min", str(min_nodes), "--max", str(max_nodes),
               "--nproc", str(nproc)]
        if conf:
            cmd += ["--conf", conf]
        if token:
            cmd += ["--token", token]
        self.p = background(cmd, env=env)
        self.lines = Lines(self.p.proc.stdout)

    @property
    def pid(self):
        return self.p.pid

    def expect(self, event, timeout=10.0):
        """The next event of this kind; other kinds before it are kept in .skipped."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.next(max(0.01, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"agent exited waiting for '{event}': {self.lines.seen}")
            ev = json.loads(line)
            if ev["event"] == event:
                return ev
            if ev["event"] in ("error", "closed"):
                raise AssertionError(f"agent got {ev} waiting for '{event}'")

    def kill9(self):
        """SIGKILL, reaped: the server may see the connection drop before the
        kernel has finished the process, so teardown must not find it alive
        and signal it again."""
        os.kill(self.pid, signal.SIGKILL)
        assert self.p.proc.wait(10) == -signal.SIGKILL

    def quiet_for(self, seconds):
        """True if the agent prints nothing for this long."""
        try:
            line = self.lines.q.get(timeout=seconds)
        except queue.Empty:
            return True
        self.lines.seen.append(line)
        return False


SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


class Procs:
    """Starts daemons and agents; at teardown, stops what still runs with
    SIGTERM and requires a clean exit (0) and no sanitizer report from any."""

    def __init__(self, background):
        self.background = background
        self.all = []

    def daemon(self, *args, **kw):
        d = Daemon(self.background, *args, **kw)
        self.all.append(d.p)
        return d

    def agent(self, d, **kw):
        a = Agent(self.background, d, **kw)
        self.all.append(a.p)
        return a

    def check(self):
        problems = []
        for p in reversed(self.all):  # agents before the daemon they talk to
            if p.proc.poll() is None:
                p.signal(signal.SIGTERM)
                rc = p.wait(20)
                if rc != 0:
                    problems.append(f"{p.args[0]} exited {rc} on SIGTERM")
            elif p.err is None:
                p.wait(5)
            for mark in SANITIZER_MARKS:
                if mark in (p.err or ""):
                    problems.append(f"{p.args[0]}: {mark}\n{p.err[-3000:]}")
        assert not problems, "\n".join(problems)


@pytest.fixture
def rz(background):
    procs = Procs(background)
    yield procs
    procs.check()


# ---- the daemon itself ----

def test_daemon_cli():
    exe = binary("cddp-rdzv")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and "--token-file" in r.stdout
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and r.stdout.startswith("cddp-rdzv ")
    for args, what in ((["--port", "70000"], "--port"), (["--bogus"], "unknown argument"),
                       (["--port"], "missing"), (["--read-timeout", "-1"], "--read-timeout"),
                       (["--token-file", "/nonexistent/x"], "--token-file")):
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2, (args, r.stderr)
        assert what in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("cddp-rdzv: ")


def test_port_in_use_is_a_clear_error(rz):
    d = rz.daemon()
    r = subprocess.run([binary("cddp-rdzv"), "--host", "127.0.0.1", "--port", str(d.port)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 1
    assert "address already in use" in r.stderr


def test_sigterm_closes_rounds_and_exits_0(rz):
    d = rz.daemon()
    agents = [rz.agent(d) for _ in range(2)]
    for a in agents:
        a.expect("round")
    d.p.signal(signal.SIGTERM)
    for a in agents:
        ev = a.expect("closed")
        assert "SIGTERM" in ev["reason"]
    assert d.p.wait(10) == 0
    for a in agents:
        assert a.p.wait(10) == 0  # agents end cleanly on "closed"


# ---- rounds ----

def test_round_distinct_ranks_and_world(rz):
    d = rz.daemon()
    nproc = [2, 3, 1, 2]
    agents = [rz.agent(d, min_nodes=4, max_nodes=4, nproc=n) for n in nproc]
    rounds = [a.expect("round") for a in agents]
    assert sorted(r["node_rank"] for r in rounds) == [0, 1, 2, 3]
    assert {r["world_size"] for r in rounds} == {sum(nproc)}
    assert {r["nnodes"] for r in rounds} == {4}
    assert len({(r["master_addr"], r["master_port"], r["round"]) for r in rounds}) == 1
    assert rounds[0]["master_addr"] == "127.0.0.1"
    # global ranks: offsets are prefix sums of nproc in node-rank order
    by_rank = sorted(zip(rounds, nproc), key=lambda x: x[0]["node_rank"])
    off = 0
    for r, n in by_rank:
        assert r["rank_offset"] == off
        off += n


def test_many_agents_one_process(rz):
    """100 agents in one rdzv-load: it checks the round itself (exit 0)."""
    d = rz.daemon()
    r = subprocess.run([binary("rdzv-load"), "--port", str(d.port), "--agents", "100",
                        "--nproc", "2", "--kill", "3", "--run-id", "hundred"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["agents"] == 100 and out["killed"] == 3


def test_sigkill_agent_restarts_the_others_at_once(rz):
    d = rz.daemon()
    agents = [rz.agent(d, min_nodes=2, max_nodes=3) for _ in range(3)]
    first = [a.expect("round") for a in agents]
    assert {r["nnodes"] for r in first} == {3}
    victim = next(a for a, r in zip(agents, first) if r["node_rank"] == 1)
    survivors = [a for a in agents if a is not victim]
    keep = {id(a): r["node_rank"] for a, r in zip(agents, first)}
    t0 = time.monotonic()
    victim.kill9()
    for a in survivors:
        ev = a.expect("restart", timeout=5)
        assert ev["reason"] == "node_lost" and ev["counted"] is False
    rounds = [a.expect("round", timeout=5) for a in survivors]
    elapsed = time.monotonic() - t0
    assert {r["nnodes"] for r in rounds} == {2}
    assert {r["round"] for r in rounds} == {2}
    assert sorted(r["node_rank"] for r in rounds) == [0, 1]
    # rank 0 survived and keeps its rank (MASTER_ADDR stays put)
    for a, r in zip(survivors, rounds):
        if keep[id(a)] == 0:
            assert r["node_rank"] == 0
    # not a timing assertion: just far below any heartbeat timeout (15 s)
    assert elapsed < 10


def test_sigstop_agent_removed_after_heartbeat_timeout(rz):
    d = rz.daemon()
    conf = "keep_alive_interval=0.2,keep_alive_max_attempt=3"
    agents = [rz.agent(d, min_nodes=2, max_nodes=3, conf=conf) for _ in range(3)]
    for a in agents:
        a.expect("round")
    frozen = agents[2]
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        for a in agents[:2]:
            ev = a.expect("restart", timeout=10)
            assert ev["reason"] == "heartbeat_timeout"
        waited = time.monotonic() - t0
        assert waited >= 0.5  # removed for its silence, not before ~0.6 s
        rounds = [a.expect("round") for a in agents[:2]]
        assert {r["nnodes"] for r in rounds} == {2}
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    # Woken up, the frozen agent finds it was removed: its connection was
    # closed with an error, and it fails.
    line = frozen.lines.next(10)
    while line is not None and json.loads(line)["event"] != "error":
        line = frozen.lines.next(10)
    assert line is not None, frozen.lines.seen
    assert frozen.p.wait(10) == 1


def test_late_joiner_scale_up_and_wait_list(rz):
    d = rz.daemon()
    conf = "last_call_timeout=0.3"
    a, b = (rz.agent(d, min_nodes=2, max_nodes=3, conf=conf) for _ in range(2))
    ra, rb = a.expect("round"), b.expect("round")
    assert ra["nnodes"] == 2
    late = rz.agent(d, min_nodes=2, max_nodes=3, conf=conf)
    for x in (a, b):
        ev = x.expect("restart")
        assert ev["reason"] == "node_joined" and ev["counted"] is False
    rounds = [x.expect("round") for x in (a, b, late)]
    assert {r["nnodes"] for r in rounds} == {3}
    assert rounds[0]["node_rank"] == ra["node_rank"]  # members keep their ranks
    assert rounds[1]["node_rank"] == rb["node_rank"]
    assert rounds[2]["node_rank"] == 2  # the newcomer comes after them
    # At max_nodes a fourth node waits and the running nodes are left alone.
    extra = rz.agent(d, min_nodes=2, max_nodes=3, conf=conf)
    assert extra.expect("waiting")["round"] == 2
    assert a.quiet_for(0.5)
    # When a member leaves, the waiting node takes its place.
    late.kill9()
    rounds = [x.expect("round") for x in (a, b, extra)]
    assert {r["nnodes"] for r in rounds} == {3}
    assert rounds[2]["node_rank"] == 2


def test_join_timeout_is_a_clear_failure(rz):
    d = rz.daemon()
    lone = rz.agent(d, min_nodes=2, max_nodes=2, conf="join_timeout=0.5")
    line = lone.lines.next(10)
    assert json.loads(line) == {"event": "error", "agent": 0, "code": "ETIMEOUT"}
    assert lone.p.wait(10) == 1
    assert "did not complete within join_timeout=0.5 s" in lone.p.err


# ---- protocol-level behaviour, spoken from Python ----

def join_pair(d, run_id="job"):
    a, b = d.peer(), d.peer()
    for p in (a, b):
        assert p.hello(run_id)["type"] == "welcome"
    a.join("a", 2, 2, master_port=1111)
    b.join("b", 2, 2)
    ra, rb = a.expect("round"), b.expect("round")
    return a, b, ra, rb


def test_failure_report_is_a_counted_restart(rz):
    d = rz.daemon()
    a, b, ra, _ = join_pair(d)
    assert ra["master_port"] == 1111 and ra["node_rank"] == 0
    b.send("failure", round=ra["round"], reason="worker exited 1")
    for p in (a, b):
        ev = p.expect("restart")
        assert ev["counted"] is True and ev["reason"] == "worker_failure"
        assert ev["node_id"] == "b" and ev["round"] == 2
        assert ev["restart_count"] == 1
    for p, n in ((a, "a"), (b, "b")):
        p.join(n, 2, 2)
    r = a.expect("round")
    assert r["round"] == 2 and r["restart_count"] == 1
    a.close(), b.close()


def test_close_reaches_everyone_and_refuses_later_joins(rz):
    d = rz.daemon()
    a, b, _, _ = join_pair(d)
    a.send("close", reason="job finished")
    for p in (a, b):
        assert p.expect("closed")["reason"] == "job finished"
    c = d.peer()
    c.hello("job")
    c.join("c", 2, 2)
    err = c.expect("error")
    assert err["code"] == "ECLOSED" and "job finished" in err["message"]
    for p in (a, b, c):
        p.close()


def test_store_and_status(rz):
    d = rz.daemon()
    a, b, _, _ = join_pair(d)
    rid = b.request("get", key="port", timeout_ms=5000)
    assert a.set("port", "29500")["type"] == "result"
    got = b.result(rid)
    assert unb64(got["value"]) == b"29500"
    rid = a.request("add", key="n", delta=2)
    assert a.result(rid)["number"] == 2
    rid = a.request("wait", keys=["never"], timeout_ms=100)
    assert a.result(rid)["code"] == "ETIMEOUT"
    rid = a.request("status")
    st = a.result(rid)["status"]
    run = next(r for r in st["runs"] if r["run_id"] == "job")
    assert run["active"] == 2 and run["phase"] == "running" and run["store_keys"] == 2
    a.close(), b.close()


def test_store_only_daemon(rz):
    d = rz.daemon("--store-only")
    p = d.peer()
    assert p.hello()["type"] == "welcome"
    assert p.set("k", b"\x00\x01")["type"] == "result"
    assert unb64(p.get("k")["value"]) == b"\x00\x01"
    p.join("x", 1, 1)
    assert p.expect("error")["code"] == "ESTATE"
    assert p.closed_by_peer()
    p.close()


@pytest.fixture
def token_daemon(rz):
    env = dict(os.environ, CDDP_RDZV_TOKEN="s3cret")
    return rz.daemon(env=env)


def test_wrong_token_refused(token_daemon, rz):
    d = token_daemon
    for tok, why in ((None, "requires a join token"), ("wrong", "does not match")):
        p = d.peer()
        err = p.hello("job", token=tok)
        assert err["type"] == "error" and err["code"] == "ETOKEN" and why in err["message"]
        assert p.closed_by_peer()
        p.close()
    # An agent with a wrong token fails with the reason; the right one gets in.
    bad = rz.agent(d, min_nodes=1, max_nodes=1, token="nope")
    assert json.loads(bad.lines.next(10))["code"] == "ETOKEN"
    assert bad.p.wait(10) == 1
    good = rz.agent(d, min_nodes=1, max_nodes=1, token="s3cret",
                    conf="last_call_timeout=0")
    assert good.expect("round")["nnodes"] == 1
    # CDDP_RDZV_TOKEN in the agent's environment works too.
    env = rz.agent(d, run_id="env", min_nodes=1, max_nodes=1, conf="last_call_timeout=0",
                   env=dict(os.environ, CDDP_RDZV_TOKEN="s3cret"))
    assert env.expect("round")["nnodes"] == 1
    assert d.alive()


def test_token_file(rz, tmp_path):
    f = tmp_path / "token"
    f.write_text("from-file\n")
    d = rz.daemon("--token-file", str(f))
    p = d.peer()
    assert p.hello("job", token="from-file")["type"] == "welcome"
    p.close()


def raw_frame(payload):
    return struct.pack(">I", len(payload)) + payload


BAD_INPUTS = {
    "garbage": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "oversized_frame": struct.pack(">I", 2 << 20) + b"{",
    "not_json": raw_frame(b"hello"),
    "json_array": raw_frame(b"[1,2]"),
    "bad_version": frame({"v": 2, "type": "hello"}),
    "unknown_type": frame({"v": 1, "type": "launch_missiles"}),
    "server_message": frame({"v": 1, "type": "hello"}) + frame({"v": 1, "type": "welcome"}),
    "missing_field": frame({"v": 1, "type": "hello", "run_id": 7}),
    "bad_run_id": frame({"v": 1, "type": "hello", "run_id": "has space"}),
    "deep_json": raw_frame(b'{"v":1,"type":"hello","x":[[[[[[[[[[]]]]]]]]]]}'),
    "nul_escape": frame({"v": 1, "type": "hello", "run_id": "a\u0000b"}),
    "join_before_hello": frame({"v": 1, "type": "join", "node_id": "x", "nproc": 1,
                                "min_nodes": 1, "max_nodes": 1}),
}
EXPECTED_CODE = {
    "garbage": "ETOOBIG", "oversized_frame": "ETOOBIG", "not_json": "EPARSE",
    "json_array": "EPARSE", "bad_version": "EPROTO_VERSION", "unknown_type": "EPROTO_TYPE",
    "server_message": "EPROTO_TYPE", "missing_field": "EPROTO_FIELD",
    "bad_run_id": "EPROTO_FIELD", "deep_json": "ETOOBIG", "nul_escape": "EPARSE",
    "join_before_hello": "ESTATE",
}


def test_bad_peers_get_an_error_and_the_server_goes_on(rz):
    d = rz.daemon("--read-timeout", "0.5")
    # A job is running the whole time; none of this may disturb it.
    members = [rz.agent(d, run_id="steady", min_nodes=2, max_nodes=2)
               for _ in range(2)]
    for a in members:
        a.expect("round")
    for name, data in BAD_INPUTS.items():
        with d.peer() as p:
            p.send_raw(data)
            err = p.recv(5)
            while err is not None and err["type"] == "welcome":
                err = p.recv(5)
            assert err is not None and err["type"] == "error", (name, err)
            assert err["code"] == EXPECTED_CODE[name], (name, err)
            assert err["message"], name
            assert p.closed_by_peer(), name
    # Half-open: connected, silent; and a frame begun but never finished.
    with d.peer() as silent, d.peer() as partial:
        partial.hello("x")
        partial.send_raw(struct.pack(">I", 100) + b'{"v":1')
        for p, why in ((silent, "no hello"), (partial, "not completed")):
            err = p.recv(5)
            assert err["code"] == "ETIMEOUT" and why in err["message"], err
            assert p.closed_by_peer()
    # A peer that vanishes mid-frame.
    p = d.peer()
    p.send_raw(struct.pack(">I", 1000) + b"{")
    p.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    p.close()  # RST
    assert d.alive()
    assert members[0].quiet_for(0.3)
    # ...and the server serves the next job.
    r = subprocess.run([binary("rdzv-load"), "--port", str(d.port), "--agents", "20",
                        "--run-id", "next"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with d.peer() as p:
        p.hello("steady")
        rid = p.request("status")
        st = p.result(rid)["status"]
        assert st["refused"] >= len(BAD_INPUTS) + 2
    assert d.alive()


def test_wrong_run_id_is_isolated(rz):
    d = rz.daemon()
    a = rz.agent(d, run_id="job-a", min_nodes=2, max_nodes=2)
    stray = rz.agent(d, run_id="job-b", min_nodes=2, max_nodes=2)
    b = rz.agent(d, run_id="job-a", min_nodes=2, max_nodes=2)
    ra, rb = a.expect("round"), b.expect("round")
    assert ra["run_id"] == rb["run_id"] == "job-a"
    assert ra["nnodes"] == 2
    assert stray.quiet_for(0.3)  # still waiting for its own job's second node


def test_one_daemon_two_jobs(rz):
    d = rz.daemon()
    job1 = [rz.agent(d, run_id="one", min_nodes=2, max_nodes=2) for _ in range(2)]
    job2 = [rz.agent(d, run_id="two", min_nodes=2, max_nodes=2, nproc=3)
            for _ in range(2)]
    r1 = [a.expect("round") for a in job1]
    r2 = [a.expect("round") for a in job2]
    assert {r["world_size"] for r in r1} == {2} and {r["world_size"] for r in r2} == {6}
    assert {r["run_id"] for r in r1} == {"one"} and {r["run_id"] for r in r2} == {"two"}
    # Losing a node of job one restarts job one only.
    job1[0].kill9()
    assert job1[1].expect("restart")["reason"] == "node_lost"
    assert all(a.quiet_for(0.3) for a in job2)
    # Both jobs running side by side, many agents each.
    procs = [subprocess.Popen([binary("rdzv-load"), "--port", str(d.port), "--agents", "50",
                               "--run-id", f"bulk{i}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err


def ipv6_loopback():
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6(rz):
    d = rz.daemon(host="::1")
    agents = [rz.agent(d, host="::1") for _ in range(2)]
    rounds = [a.expect("round") for a in agents]
    assert {r["master_addr"] for r in rounds} == {"::1"}


def test_host_name(rz):
    d = rz.daemon(host="localhost")
    agents = [rz.agent(d, host="localhost") for _ in range(2)]
    rounds = [a.expect("round") for a in agents]
    assert sorted(r["node_rank"] for r in rounds) == [0, 1]


def test_all_interfaces_default(rz):
    """No --host: every interface, IPv4 clients included (dual stack)."""
    d = rz.daemon(host="")
    with Peer("127.0.0.1", d.port) as peer:
        assert peer.hello("x")["type"] == "welcome"
