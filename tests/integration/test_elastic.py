"""Multi-node cddprun: real agents (one process per "node") on loopback.

Every agent is a real cddprun with its own workers; nodes are told apart by
the NODE variable each agent passes on to its workers. The workers are a
small shell script that records the environment it was given (one file per
worker process) and then sleeps until it is stopped, so a test sees every
round every node started: a round is identified by its MASTER_PORT (node 0
picks a fresh one for each round).

What is asserted: one world per round (distinct RANK 0..N-1, one
WORLD_SIZE, one MASTER_ADDR/PORT, GROUP_RANK and rank offsets consistent),
the survivors' new round after a node is SIGKILLed or frozen (SIGSTOP), a
late node admitted (scale-up) and one beyond max waiting, worker failures
restarting every node (counted once, for the whole job), clear errors (join
token, run id, --nnodes, a lost host, too few nodes), cddp-rdzv shared by
two jobs, a lost cddp-rdzv (killed and restarted, frozen, a connection reset
on the agent's side only: reconnect, then a new round or the same one),
--standalone, the static backend with two nodes, IPv6. The
conftest's orphan check runs after every test: a SIGKILLed agent's workers
must be gone too.
"""
import json
import os
import pathlib
import queue
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest

from conftest import ROOT, binary, free_port, wait_for

EXIT_INFRA = 5  # cddprun: the rendezvous lost or closed under the node (docs/cli.md)

WORKER = r"""#!/bin/sh
# Records the environment cddprun gave this worker, then lives LIFETIME
# seconds (default: until stopped). FAIL_RANK exits 3 at once while
# TORCHELASTIC_RESTART_COUNT < FAIL_COUNT.
f="$OUT/w.$$"
{ env | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_RESTART_COUNT|TORCHELASTIC_RUN_ID|TORCHELASTIC_USE_AGENT_STORE|NODE)='
  echo "PID=$$"; } > "$f.tmp" && mv "$f.tmp" "$f.env"
if [ "$RANK" = "${FAIL_RANK:--1}" ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt "${FAIL_COUNT:-0}" ]; then
    exit 3
fi
exec sleep "${LIFETIME:-3600}"
"""

# Short keep-alive so a frozen node is found in about a second; last call
# short so MIN:MAX rounds form quickly.
FAST = "keep_alive_interval=0.2,keep_alive_max_attempt=3,last_call_timeout=0.5"


def envs(out, ignore=()):
    """Every worker start so far (but those in ignore, a snapshot()): a list
    of dicts (the recorded variables)."""
    found = []
    for f in sorted(pathlib.Path(out).glob("w.*.env")):
        if f.name in ignore:
            continue
        d = {}
        for line in f.read_text().splitlines():
            k, _, v = line.partition("=")
            d[k] = v
        found.append(d)
    return found


def snapshot(out):
    """The worker starts so far, to be ignored by later waits."""
    return {f.name for f in pathlib.Path(out).glob("w.*.env")}


def rounds(out, ignore=()):
    """Worker starts grouped by round (MASTER_PORT), oldest first."""
    by = {}
    for e in envs(out, ignore):
        by.setdefault(e["MASTER_PORT"], []).append(e)
    return list(by.values())


def wait_round(out, world, timeout=20, ignore=()):
    """The workers of a round with this WORLD_SIZE, once all have started
    (only starts not in ignore, a snapshot() taken before what starts it)."""
    def done():
        for r in rounds(out, ignore):
            if len(r) == world and all(int(e["WORLD_SIZE"]) == world for e in r):
                return r
        return None
    return wait_for(done, timeout=timeout, what=f"a round of world size {world} in {out}")


def check_world(r, nnodes, nproc):
    """One consistent world: torchrun's variables, rank offsets by node."""
    world = sum(nproc)
    assert sorted(int(e["RANK"]) for e in r) == list(range(world))
    assert {e["WORLD_SIZE"] for e in r} == {str(world)}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in r}) == 1
    assert {e["GROUP_WORLD_SIZE"] for e in r} == {str(nnodes)}
    assert {e["TORCHELASTIC_USE_AGENT_STORE"] for e in r} == {"True"}  # the agent's store
    assert len({e["TORCHELASTIC_RUN_ID"] for e in r}) == 1
    by_group = {}
    for e in r:
        assert e["ROLE_RANK"] == e["RANK"]
        by_group.setdefault(int(e["GROUP_RANK"]), []).append(e)
    assert sorted(by_group) == list(range(nnodes))
    offset = 0
    for g in range(nnodes):
        workers = by_group[g]
        assert len({e["NODE"] for e in workers}) == 1, "one node per group rank"
        n = len(workers)
        assert {e["LOCAL_WORLD_SIZE"] for e in workers} == {str(n)}
        assert sorted(int(e["LOCAL_RANK"]) for e in workers) == list(range(n))
        for e in workers:
            assert int(e["RANK"]) == offset + int(e["LOCAL_RANK"])
        offset += n
    assert sorted(len(by_group[g]) for g in by_group) == sorted(nproc)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Agent:
    """One cddprun, its stderr in a file."""

    def __init__(self, background, tmp, name, args, env=None, script=None, script_args=(),
                 prefix=(), siblings=None):
        self.name = name
        # The cluster's agents (this one among them): a failed wait prints
        # every agent's log, since a hang in one is often caused by another.
        self.siblings = siblings if siblings is not None else [self]
        self.log = tmp / f"agent-{name}.log"
        e = dict(os.environ, NODE=name, OUT=str(tmp / "out"), LOGLEVEL="INFO",
                 TORCH_ELASTIC_SHUTDOWN_TIMEOUT="2")
        e.update(env or {})
        cmd = [*prefix, binary("cddprun"), *args, str(script or tmp / "worker.sh"), *script_args]
        with open(self.log, "w") as fh:
            self.bg = background(cmd, env=e, stdout=subprocess.DEVNULL, stderr=fh)

    @property
    def pid(self):
        return self.bg.pid

    def text(self):
        return self.log.read_text(errors="replace")

    def wait_log(self, what, timeout=20):
        wait_for(lambda: what in self.text(), timeout=timeout, what=f"'{what}' in {self.log}")

    def wait(self, timeout=30):
        try:
            return self.bg.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.bg.kill()
            others = "".join(
                f"\n--- agent {a.name} ({'running' if a.bg.proc.poll() is None else f'exit {a.bg.proc.returncode}'}):\n"
                f"{a.text()[-3000:]}" for a in self.siblings if a is not self)
            pytest.fail(f"agent {self.name} did not exit within {timeout}s:\n{self.text()[-3000:]}"
                        f"{others}")

    def signal(self, sig):
        os.kill(self.pid, sig)


@pytest.fixture
def cluster(background, tmp_path):
    """cluster.agent(name, *args) starts one node; the worker script and the
    output directory are set up."""
    (tmp_path / "out").mkdir()
    w = tmp_path / "worker.sh"
    w.write_text(WORKER)
    w.chmod(0o755)

    class Cluster:
        out = tmp_path / "out"
        tmp = tmp_path
        agents = []

        def agent(self, name, *args, **kw):
            a = Agent(background, tmp_path, name, args, siblings=self.agents, **kw)
            self.agents.append(a)
            return a

    c = Cluster()
    c.agents = []
    yield c
    for a in c.agents:
        if a.bg.proc.poll() is None:
            a.bg.kill()
        for mark in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            assert mark not in a.text(), f"agent {a.name}: {mark}\n{a.text()[-3000:]}"


def c10d(port, nnodes, nproc=2, conf=None, run_id="job", **kw):
    args = [f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}"]
    if conf:
        args.append(f"--rdzv_conf={conf}")
    for k, v in kw.items():
        args.append(f"--{k}={v}")
    return args


# ---- one world ----

@pytest.mark.parametrize("nproc", [[2, 2], [2, 1, 3, 2]], ids=["2x2", "4-nodes-mixed"])
def test_agents_form_one_world(cluster, nproc):
    """N agents with any number of workers each: one world, every agent exits 0."""
    port = free_port()
    n = len(nproc)
    agents = [cluster.agent(str(i), *c10d(port, n, nproc=p), env={"LIFETIME": "0.5"})
              for i, p in enumerate(nproc)]
    for a in agents:
        assert a.wait() == 0, a.text()
    (r,) = rounds(cluster.out)
    check_world(r, n, nproc)
    assert r[0]["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert r[0]["MASTER_ADDR"] == "127.0.0.1"
    # Exactly one agent hosted the rendezvous (the others found it served).
    hosts = [a for a in agents if "hosting the rendezvous" in a.text()]
    assert len(hosts) == 1
    # The job closed the rendezvous at the end; the hosting agent waited for
    # the others, then shut its server down: the port is free again.
    assert "shutting down the rendezvous server" in hosts[0].text()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.heavy
def test_ddp_across_two_agents_matches_one_node(cluster, torch_python, tmp_path):
    """PyTorch DDP (gloo, env://) across 2 agents x 2 workers trains exactly
    as 4 workers on one node: same losses, same final weights."""
    script = ROOT / "tests" / "compat" / "ddp_train.py"
    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir(), one.mkdir()
    port = free_port()
    agents = [cluster.agent(str(i), *c10d(port, 2), script=script, script_args=["--out", two],
                            env={"PYTHON_EXEC": torch_python})
              for i in range(2)]
    for a in agents:
        assert a.wait(timeout=300) == 0, a.text()
    single = subprocess.run([binary("cddprun"), "--nproc_per_node=4",
                             f"--master_port={free_port()}", str(script), "--out", str(one)], env=dict(os.environ, PYTHON_EXEC=torch_python),
                            capture_output=True, text=True, timeout=240)
    assert single.returncode == 0, single.stderr
    r2 = json.loads((two / "result.json").read_text())
    r1 = json.loads((one / "result.json").read_text())
    assert r2["world_size"] == r1["world_size"] == 4
    assert r2["env"]["GROUP_RANK"] == "0"
    assert r2["losses"] == r1["losses"]
    assert r2["losses"][-1] < r2["losses"][0]
    assert r2["weights_sha256"] == r1["weights_sha256"]


# ---- lost nodes ----

def test_sigkill_one_agent_survivors_restart(cluster):
    """A SIGKILLed agent's workers die with it; the survivors stop theirs at
    once and run again in a new round with the smaller world, without
    spending a restart."""
    port = free_port()
    a = cluster.agent("0", *c10d(port, "2:3", conf="is_host=1," + FAST))
    b = cluster.agent("1", *c10d(port, "2:3", conf="is_host=0," + FAST))
    c = cluster.agent("2", *c10d(port, "2:3", conf="is_host=0," + FAST))
    first = wait_round(cluster.out, 6)
    check_world(first, 3, [2, 2, 2])
    victims = [int(e["PID"]) for e in first if e["NODE"] == "2"]
    t0 = time.monotonic()
    before = snapshot(cluster.out)
    c.signal(signal.SIGKILL)
    second = wait_round(cluster.out, 4, ignore=before)
    check_world(second, 2, [2, 2])
    assert {e["NODE"] for e in second} == {"0", "1"}
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in second} == {"0"}
    # Ranks of the survivors' nodes stay where they were when they can.
    old = {e["NODE"]: e["GROUP_RANK"] for e in first}
    new = {e["NODE"]: e["GROUP_RANK"] for e in second}
    for node in ("0", "1"):
        if int(old[node]) < 2:
            assert new[node] == old[node]
    wait_for(lambda: not any(alive(p) for p in victims), timeout=10,
             what="the killed agent's workers to go")
    assert time.monotonic() - t0 < 15
    assert "was lost" in b.text()
    stop(b, a)


def stop(*agents):
    """SIGTERM, one after the other: each exits 128+15. The agent hosting
    the rendezvous last (it closes the rendezvous for the others)."""
    for x in agents:
        x.signal(signal.SIGTERM)
        assert x.wait() == 128 + signal.SIGTERM, x.text()[-2000:]


def test_sigstop_agent_removed_after_heartbeat_timeout(cluster):
    """A frozen agent (SIGSTOP) misses its heartbeats: the others go on
    without it; woken up, it learns it was removed, stops its workers and
    joins again as a new member (issue 15: it used to exit 1), so the job
    scales back up to three nodes."""
    port = free_port()
    a = cluster.agent("0", *c10d(port, "2:3", conf="is_host=1," + FAST))
    b = cluster.agent("1", *c10d(port, "2:3", conf="is_host=0," + FAST))
    c = cluster.agent("2", *c10d(port, "2:3", conf="is_host=0," + FAST))
    first = wait_round(cluster.out, 6)
    before = snapshot(cluster.out)
    c.signal(signal.SIGSTOP)
    try:
        second = wait_round(cluster.out, 4, ignore=before)
        assert {e["NODE"] for e in second} == {"0", "1"}
        assert "no heartbeat" in b.text()
    finally:
        c.signal(signal.SIGCONT)
    before = snapshot(cluster.out)
    third = wait_round(cluster.out, 6, ignore=before)
    check_world(third, 3, [2, 2, 2])
    text = c.text()
    assert "sent no heartbeat" in text or "heard nothing from the rendezvous server" in text, \
        text[-2000:]
    assert "again as a new member" in text
    frozen = [int(e["PID"]) for e in first if e["NODE"] == "2"]
    assert not any(alive(p) for p in frozen)
    assert c.bg.proc.poll() is None
    stop(c, b, a)


def test_lost_host_ends_the_job_with_a_clear_error(cluster):
    """The agent hosting the rendezvous is killed: the others try to
    reconnect for join_timeout (a restarted host would serve them a new
    round), then stop their workers and say why."""
    port = free_port()
    conf = "join_timeout=1.5," + FAST
    host = cluster.agent("0", *c10d(port, "1:2", conf="is_host=1," + conf))
    other = cluster.agent("1", *c10d(port, "1:2", conf="is_host=0," + conf))
    first = wait_round(cluster.out, 4)
    host.signal(signal.SIGKILL)
    assert other.wait() == EXIT_INFRA  # the rendezvous lost
    text = other.text()
    assert "reconnecting (for up to 1.5 s)" in text
    assert "lost the rendezvous" in text and "could not reconnect within 1.5 s" in text
    # Its own workers are gone when it exits; the host's go with the host
    # (its guardian kills them), a moment later.
    assert not any(alive(int(e["PID"])) for e in first if e["NODE"] == "1")
    wait_for(lambda: not any(alive(int(e["PID"])) for e in first), timeout=10,
             what="the killed host's workers to go")


def test_restarted_host_serves_the_job_on(cluster):
    """The hosting agent is killed and its node started again (a scheduler
    restarting the pod): the new agent hosts a fresh rendezvous on the same
    endpoint, the other agent reconnects to it, and the job goes on in a
    new round (numbered on from the last) without spending a restart."""
    port = free_port()
    host = cluster.agent("0", *c10d(port, 2, conf="is_host=1," + FAST))
    other = cluster.agent("1", *c10d(port, 2, conf="is_host=0," + FAST))
    first = wait_round(cluster.out, 4)
    before = snapshot(cluster.out)
    host.signal(signal.SIGKILL)
    other.wait_log("reconnecting")
    again = cluster.agent("0", *c10d(port, 2, conf="is_host=1," + FAST))
    second = wait_round(cluster.out, 4, ignore=before)
    check_world(second, 2, [2, 2])
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in second} == {"0"}
    other.wait_log("rendezvous complete: round 2")
    wait_for(lambda: not any(alive(int(e["PID"])) for e in first), timeout=10,
             what="the first round's workers to go")
    stop(other, again)


def test_host_stopped_by_signal_closes_the_job(cluster):
    """The hosting agent is stopped (SIGTERM): its server goes with it, so
    it closes the rendezvous and every other node hears why."""
    port = free_port()
    host = cluster.agent("0", *c10d(port, "1:2", conf="is_host=1," + FAST))
    other = cluster.agent("1", *c10d(port, "1:2", conf="is_host=0," + FAST))
    wait_round(cluster.out, 4)
    stop(host)
    assert other.wait() == EXIT_INFRA  # closed under it by a preempted host
    assert "the rendezvous closed:" in other.text() and "received SIGTERM" in other.text()


def test_below_min_nodes_fails_after_join_timeout(cluster):
    port = free_port()
    conf = "join_timeout=1.5," + FAST
    a = cluster.agent("0", *c10d(port, 2, conf="is_host=1," + conf))
    b = cluster.agent("1", *c10d(port, 2, conf="is_host=0," + conf))
    wait_round(cluster.out, 4)
    b.signal(signal.SIGKILL)
    assert a.wait() == EXIT_INFRA
    text = a.text()
    assert "did not complete within join_timeout=1.5 s" in text and "min_nodes=2" in text


# ---- scale-up ----

def test_late_agent_scales_up_to_max(cluster):
    """2:3 nodes: a third agent makes the running two restart (not counted)
    and join it; a fourth waits for a place, and takes the one a lost node
    frees."""
    port = free_port()
    args = lambda host: c10d(port, "2:3", conf=f"is_host={host}," + FAST)  # noqa: E731
    a = cluster.agent("0", *args(1))
    b = cluster.agent("1", *args(0))
    first = wait_round(cluster.out, 4)
    before = snapshot(cluster.out)
    c = cluster.agent("2", *args(0))
    second = wait_round(cluster.out, 6, ignore=before)
    check_world(second, 3, [2, 2, 2])
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in second} == {"0"}
    assert not any(alive(int(e["PID"])) for e in first)
    before = snapshot(cluster.out)
    d = cluster.agent("3", *args(0))
    d.wait_log("waits for a place")
    time.sleep(0.5)  # nothing may happen to the running round meanwhile
    assert snapshot(cluster.out) == before
    c.signal(signal.SIGKILL)
    third = wait_round(cluster.out, 6, ignore=before)
    assert {e["NODE"] for e in third} == {"0", "1", "3"}
    # A node stopped by a signal leaves: the others hear it as such.
    stop(b)
    a.wait_log("' left; will restart worker group")
    stop(d, a)


def test_unequal_finish_and_exit_barrier_timeout(cluster):
    """Node 0's workers finish long before node 1's: node 0's exit barrier
    times out (CDDP_EXIT_BARRIER_TIMEOUT), it exits 0 without disturbing
    node 1, and as the host it keeps serving until node 1 is done."""
    port = free_port()
    env = {"CDDP_EXIT_BARRIER_TIMEOUT": "0.3"}
    host = cluster.agent("0", *c10d(port, 2, conf="is_host=1," + FAST),
                         env=dict(env, LIFETIME="0.1"))
    late = cluster.agent("1", *c10d(port, 2, conf="is_host=0," + FAST),
                         env=dict(env, LIFETIME="2"))
    host.wait_log("keeps serving the rendezvous")
    assert host.bg.proc.poll() is None
    assert late.wait() == 0, late.text()
    assert host.wait() == 0, host.text()
    assert len(rounds(cluster.out)) == 1, "nobody restarted"
    assert "Error waiting on exit barrier" in host.text()
    assert "Error waiting on exit barrier" not in late.text()


# ---- worker failures ----

def test_worker_failure_restarts_every_node_counted_once(cluster):
    """One node's worker fails: every node restarts in one new round, and
    TORCHELASTIC_RESTART_COUNT is 1 on every node."""
    port = free_port()
    env = {"FAIL_RANK": "3", "FAIL_COUNT": "1", "LIFETIME": "1"}
    a = cluster.agent("0", *c10d(port, 2, conf="is_host=1," + FAST, max_restarts=2), env=env)
    b = cluster.agent("1", *c10d(port, 2, conf="is_host=0," + FAST, max_restarts=2), env=env)
    assert a.wait() == 0, a.text()
    assert b.wait() == 0, b.text()
    rs = rounds(cluster.out)
    assert len(rs) == 2
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in rs[0]} == {"0"}
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in rs[1]} == {"1"}
    check_world(rs[1], 2, [2, 2])
    failing = "0" if "Worker group FAILED" in a.text() else "1"
    other = b if failing == "0" else a
    assert "failed (restart 1 of the job)" in other.text()


def test_restarts_used_up_end_the_job_on_every_node(cluster):
    port = free_port()
    env = {"FAIL_RANK": "0", "FAIL_COUNT": "99"}
    a = cluster.agent("0", *c10d(port, 2, conf="is_host=1," + FAST, max_restarts=1), env=env)
    b = cluster.agent("1", *c10d(port, 2, conf="is_host=0," + FAST, max_restarts=1), env=env)
    assert a.wait() == 1  # the job failed: 1 on every node, not 5
    assert b.wait() == 1
    assert len(rounds(cluster.out)) == 2
    fails = [x for x in (a, b) if "Root Cause (first observed failure)" in x.text()]
    assert len(fails) == 1, "the node whose worker failed prints the table"
    for x in (a, b):
        assert "no restarts left" in x.text()


# ---- refused ----

def test_wrong_token_wrong_run_id_wrong_nnodes(cluster):
    port = free_port()
    conf = "is_host=1,token=s3cret," + FAST
    good = [cluster.agent("0", *c10d(port, 2, conf=conf)),
            cluster.agent("1", *c10d(port, 2, conf="is_host=0," + FAST),
                          env={"CDDP_RDZV_TOKEN": "s3cret"})]
    first = wait_round(cluster.out, 4)
    bad = cluster.agent("x", *c10d(port, 2, conf="is_host=0,token=nope"))
    assert bad.wait() == 1
    assert "join token refused" in bad.text()
    none = cluster.agent("y", *c10d(port, 2, conf="is_host=0"))
    assert none.wait() == 1
    assert "requires a join token" in none.text()
    other = cluster.agent("z", *c10d(port, 2, run_id="jbo", conf="is_host=0,join_timeout=1"),
                          env={"CDDP_RDZV_TOKEN": "s3cret"})
    assert other.wait() == EXIT_INFRA  # no round within join_timeout
    assert "rendezvous 'jbo' round 1 did not complete within join_timeout" in other.text()
    mism = cluster.agent("w", *c10d(port, 3, conf="is_host=0"), env={"CDDP_RDZV_TOKEN": "s3cret"})
    assert mism.wait() == 1
    assert "--nnodes=2:2" in mism.text()
    # The job itself never noticed.
    assert len(rounds(cluster.out)) == 1 and len(first) == 4
    stop(good[1], good[0])


def test_unreachable_endpoint_is_a_clear_error(cluster):
    port = free_port()
    a = cluster.agent("0", *c10d(port, 2, conf="is_host=0,read_timeout=0.5"))
    b = cluster.agent("1", "--nnodes=2", "--rdzv_backend=c10d",
                      "--rdzv_endpoint=no-such-host.invalid:29400", "--rdzv_conf=read_timeout=0.5")
    assert a.wait() == EXIT_INFRA and b.wait() == EXIT_INFRA
    assert f"cannot connect to 127.0.0.1:{port}: connection refused (kept trying for 0.5 s)" \
        in a.text()
    assert "cannot resolve 'no-such-host.invalid'" in b.text()
    assert envs(cluster.out) == []


def test_finished_job_is_closed_to_late_agents(cluster):
    port = free_port()
    d = subprocess.Popen([binary("cddp-rdzv"), "--host", "127.0.0.1", "--port", str(port)],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "listening on" in d.stdout.readline()
        for i in range(2):
            cluster.agent(str(i), *c10d(port, 2, conf="is_host=0"), env={"LIFETIME": "0.2"})
        for a in cluster.agents:
            assert a.wait() == 0, a.text()
        late = cluster.agent("late", *c10d(port, 2, conf="is_host=0"))
        assert late.wait() == EXIT_INFRA
        assert "rendezvous 'job' is closed (the job finished)" in late.text()
    finally:
        d.send_signal(signal.SIGTERM)
        assert d.wait(timeout=20) == 0


# ---- a lost rendezvous server: reconnect, resume or a new round ----

class Daemon:
    """cddp-rdzv on 127.0.0.1:port, in its own session; restartable."""

    def __init__(self, port):
        self.port = port
        self.p = None
        self.args = []  # more flags for the next start()
        self.start()

    def start(self):
        self.p = subprocess.Popen([binary("cddp-rdzv"), "--host", "127.0.0.1", "--port",
                                   str(self.port), *self.args], stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        assert "listening on" in self.p.stdout.readline()

    def signal(self, sig):
        os.kill(self.p.pid, sig)

    def kill(self):
        self.p.kill()
        self.p.wait(timeout=10)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            assert self.p.wait(timeout=20) == 0


@pytest.fixture
def daemon():
    """daemon() -> a Daemon on a free port; killed at teardown."""
    ds = []

    def start():
        d = Daemon(free_port())
        ds.append(d)
        return d

    yield start
    for d in ds:
        if d.p.poll() is None:
            os.kill(d.p.pid, signal.SIGCONT)
            d.kill()


def test_daemon_killed_and_restarted_the_job_goes_on(cluster, daemon):
    """cddp-rdzv dies with SIGKILL while two agents run: the workers keep
    running while the agents reconnect; with rebuilds turned off
    (resume_timeout=0; by default the restarted daemon rebuilds the round:
    test_rdzv_restart.py) the restarted daemon has lost the run, so the
    agents restart their workers (not counted) in a new round, numbered on
    from the last; nobody exits."""
    d = daemon()
    conf = "is_host=0,resume_timeout=0," + FAST
    a = cluster.agent("0", *c10d(d.port, 2, conf=conf))
    b = cluster.agent("1", *c10d(d.port, 2, conf=conf))
    first = wait_round(cluster.out, 4)
    before = snapshot(cluster.out)
    d.kill()
    for x in (a, b):
        x.wait_log("reconnecting (for up to 600.0 s)")
    assert all(alive(int(e["PID"])) for e in first), "the workers run on meanwhile"
    d.start()
    second = wait_round(cluster.out, 4, ignore=before)
    check_world(second, 2, [2, 2])
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in second} == {"0"}
    wait_for(lambda: not any(alive(int(e["PID"])) for e in first), timeout=10,
             what="the first round's workers to be stopped")
    for x in (a, b):
        x.wait_log("rendezvous complete: round 2")
        assert "round ended while it was disconnected" in x.text()
        assert x.bg.proc.poll() is None
    stop(b, a)
    d.stop()


def test_daemon_frozen(cluster, daemon):
    """cddp-rdzv stopped (SIGSTOP) but still connected: for less than
    read_timeout nothing happens; for longer, the agents declare it lost and
    reconnect; when it wakes (SIGCONT) it has removed them, and they form a
    new round with it (rebuilds off: resume_timeout=0; had the daemon
    forgotten the run, it would rebuild the round as a restarted one does)."""
    d = daemon()
    conf = "is_host=0,resume_timeout=0,keep_alive_interval=0.2,keep_alive_max_attempt=10,last_call_timeout=0.5," \
           "read_timeout=1.5"
    a = cluster.agent("0", *c10d(d.port, 2, conf=conf))
    b = cluster.agent("1", *c10d(d.port, 2, conf=conf))
    first = wait_round(cluster.out, 4)
    before = snapshot(cluster.out)
    d.signal(signal.SIGSTOP)
    try:
        time.sleep(0.6)  # the freeze under test: shorter than read_timeout
    finally:
        d.signal(signal.SIGCONT)
    time.sleep(1.5)  # nothing may happen meanwhile, nor just after
    assert snapshot(cluster.out) == before
    assert all("reconnecting" not in x.text() for x in (a, b))

    d.signal(signal.SIGSTOP)
    try:
        for x in (a, b):
            x.wait_log("sent nothing for", timeout=15)
        assert all(alive(int(e["PID"])) for e in first)
    finally:
        d.signal(signal.SIGCONT)
    second = wait_round(cluster.out, 4, ignore=before)
    check_world(second, 2, [2, 2])
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in second} == {"0"}
    for x in (a, b):
        assert x.bg.proc.poll() is None
    stop(b, a)
    d.stop()


class ResetProxy:
    """A TCP relay in front of a server, run on a thread; reset() cuts the
    agents' side of every connection (RST, as a middlebox dropping its state)
    while the server's side stays open, so the server does not notice;
    drop_stale() then closes those server sides."""

    def __init__(self, target_port):
        self.sel = selectors.DefaultSelector()
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.lsock.setblocking(False)
        self.port = self.lsock.getsockname()[1]
        self.target = target_port
        self.peer = {}  # socket -> the other end (None: a server side left behind)
        self.upstream = set()  # the server sides
        self.cmds = queue.Queue()
        self.stopping = False
        self.sel.register(self.lsock, selectors.EVENT_READ)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _close(self, s):
        try:
            self.sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()
        self.peer.pop(s, None)
        self.upstream.discard(s)

    def _command(self, cmd):
        for s, other in list(self.peer.items()):
            if cmd == "reset" and s not in self.upstream and other is not None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.peer[other] = None
                self._close(s)
            elif cmd == "drop_stale" and other is None:
                self._close(s)

    def _run(self):
        while not self.stopping:
            while not self.cmds.empty():
                cmd, done = self.cmds.get()
                self._command(cmd)
                done.set()
            for key, _ in self.sel.select(timeout=0.02):
                s = key.fileobj
                if s is self.lsock:
                    c, _ = self.lsock.accept()
                    u = socket.create_connection(("127.0.0.1", self.target))
                    for x in (c, u):
                        x.setblocking(False)
                        self.sel.register(x, selectors.EVENT_READ)
                    self.peer[c], self.peer[u] = u, c
                    self.upstream.add(u)
                    continue
                if s not in self.peer:
                    continue  # closed earlier in this batch
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                other = self.peer.get(s)
                if not data:
                    self._close(s)
                    if other is not None:
                        self._close(other)
                elif other is not None:
                    other.setblocking(True)
                    other.sendall(data)
                    other.setblocking(False)
        for s in list(self.peer):
            self._close(s)
        self.lsock.close()

    def _do(self, cmd):
        done = threading.Event()
        self.cmds.put((cmd, done))
        assert done.wait(10), f"the proxy did not {cmd}"

    def reset(self):
        self._do("reset")

    def drop_stale(self):
        self._do("drop_stale")

    def close(self):
        self.stopping = True
        self.t.join(10)


def test_connection_reset_resumes_the_round(cluster, daemon):
    """An agent's connection is reset on its side only (a middlebox): it
    reconnects and resumes its round on the new connection; the server,
    which never saw the old one go, has nothing to restart: the workers of
    both nodes run on, untouched. The old connection closing later changes
    nothing either."""
    d = daemon()
    proxy = ResetProxy(d.port)
    try:
        a = cluster.agent("0", *c10d(d.port, 2, conf="is_host=0," + FAST))
        b = cluster.agent("1", *c10d(proxy.port, 2, conf="is_host=0," + FAST))
        first = wait_round(cluster.out, 4)
        before = snapshot(cluster.out)
        proxy.reset()
        b.wait_log("still in round 1; the workers keep running")
        assert "reconnecting" in b.text()
        proxy.drop_stale()  # the server sees the old connection go now
        time.sleep(0.5)  # nothing may happen meanwhile
        assert snapshot(cluster.out) == before
        assert all(alive(int(e["PID"])) for e in first)
        assert "will restart worker group" not in a.text() + b.text()
        stop(b, a)
    finally:
        proxy.close()
    d.stop()


# ---- where the server runs ----

def test_daemon_shared_by_two_jobs(cluster):
    port = free_port()
    d = subprocess.Popen([binary("cddp-rdzv"), "--host", "127.0.0.1", "--port", str(port)],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "listening on" in d.stdout.readline()
        jobs = {}
        for job in ("j1", "j2"):
            jobs[job] = [cluster.agent(f"{job}-{i}", *c10d(port, 2, run_id=job, conf="is_host=0"),
                                       env={"LIFETIME": "1"}) for i in range(2)]
        for a in cluster.agents:
            assert a.wait() == 0, a.text()
            assert "hosting" not in a.text()
        rs = rounds(cluster.out)
        assert len(rs) == 2
        for r in rs:
            check_world(r, 2, [2, 2])
            assert len({e["NODE"].split("-")[0] for e in r}) == 1, "jobs never mix"
        assert d.poll() is None
    finally:
        d.send_signal(signal.SIGTERM)
        assert d.wait(timeout=20) == 0


def test_standalone(cluster):
    """--standalone: an in-process rendezvous on loopback; a failure restart
    is counted; two standalone jobs at once do not collide."""
    env = {"FAIL_RANK": "1", "FAIL_COUNT": "1", "LIFETIME": "0.3"}
    a = cluster.agent("a", "--standalone", "--nproc_per_node=2", "--max_restarts=1", env=env)
    b = cluster.agent("b", "--standalone", "--nproc_per_node=2", env={"LIFETIME": "0.3"})
    assert a.wait() == 0, a.text()
    assert b.wait() == 0, b.text()
    by_node = {}
    for e in envs(cluster.out):
        by_node.setdefault(e["NODE"], []).append(e)
    counts = sorted(e["TORCHELASTIC_RESTART_COUNT"] for e in by_node["a"])
    # Rank 1 fails at once on the first attempt, so rank 0 may be stopped
    # before it records anything; the second attempt runs both to the end.
    assert counts.count("1") == 2 and 1 <= counts.count("0") <= 2, counts
    assert by_node["a"][0]["TORCHELASTIC_RUN_ID"] != by_node["b"][0]["TORCHELASTIC_RUN_ID"]
    assert "127.0.0.1:" in a.text()  # hosted on loopback


def test_design_command_without_backend(cluster):
    """The design's command, on two "nodes": no --rdzv_backend and no
    --node_rank. torchrun's static default would make both node rank 0;
    cddprun runs it as c10d at the endpoint (a host name here)."""
    port = free_port()
    for i in range(2):
        cluster.agent(str(i), "--nnodes=2", "--nproc_per_node=2",
                      f"--rdzv_endpoint=localhost:{port}", "--rdzv_id=job7",
                      env={"LIFETIME": "0.3"})
    for a in cluster.agents:
        assert a.wait() == 0, a.text()
        assert "rdzv_backend     : c10d" in a.text()
    (r,) = rounds(cluster.out)
    check_world(r, 2, [2, 2])


def test_static_two_nodes(cluster):
    """The static backend with fixed node ranks: MASTER_ADDR/PORT are the
    given ones (the workers' rank 0 serves its store there), the agents meet
    on the next port, node 0 hosting."""
    port = free_port()
    args = lambda rank: ["--nnodes=2", "--nproc_per_node=2", f"--node_rank={rank}",  # noqa: E731
                         "--master_addr=127.0.0.1", f"--master_port={port}"]
    b = cluster.agent("n1", *args(1), env={"LIFETIME": "0.5"})
    a = cluster.agent("n0", *args(0), env={"LIFETIME": "0.5"})
    assert a.wait() == 0, a.text()
    assert b.wait() == 0, b.text()
    (r,) = rounds(cluster.out)
    check_world(r, 2, [2, 2])
    for e in r:
        assert e["GROUP_RANK"] == e["NODE"][1:]
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("127.0.0.1", str(port))
    assert f"127.0.0.1:{port + 1}" in a.text()


def test_ipv6_endpoint(cluster):
    try:
        port = free_port("::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    for i in range(2):
        cluster.agent(str(i), "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                      f"--rdzv_endpoint=[::1]:{port}", "--rdzv_id=v6", env={"LIFETIME": "0.3"})
    for a in cluster.agents:
        assert a.wait() == 0, a.text()
    (r,) = rounds(cluster.out)
    check_world(r, 2, [1, 1])
    assert r[0]["MASTER_ADDR"] == "::1"


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: nodes with distinct
    addresses (10.213.N.1 and .2). Skips where ip netns is not permitted."""
    tag = os.getpid() % 100000
    ns = [f"cddp{tag}a", f"cddp{tag}b"]
    r = _ip("netns", "add", ns[0], check=False)
    if r.returncode != 0:
        pytest.skip(f"ip netns is not permitted here: {r.stderr.strip()}")
    net = 16 + tag % 200
    addrs = [f"10.213.{net}.1", f"10.213.{net}.2"]
    try:
        _ip("netns", "add", ns[1])
        _ip("link", "add", f"ve{tag}a", "type", "veth", "peer", "name", f"ve{tag}b")
        for i, side in enumerate("ab"):
            _ip("link", "set", f"ve{tag}{side}", "netns", ns[i])
            _ip("-n", ns[i], "addr", "add", f"{addrs[i]}/24", "dev", f"ve{tag}{side}")
            _ip("-n", ns[i], "link", "set", f"ve{tag}{side}", "up")
            _ip("-n", ns[i], "link", "set", "lo", "up")
        yield ns, addrs
    finally:
        for n in ns:
            _ip("netns", "del", n, check=False)


def test_two_hosts_in_network_namespaces(cluster, two_hosts):
    """Nodes on distinct addresses: the agent on the endpoint's host guesses
    it hosts (its interface has the address), the other joins it; MASTER_ADDR
    is node 0's address as the other node reaches it, not loopback."""
    ns, addrs = two_hosts
    port = 29400  # each namespace has its own ports
    for i in range(2):
        cluster.agent(str(i), "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                      f"--rdzv_endpoint={addrs[0]}:{port}", "--rdzv_id=ns",
                      prefix=["ip", "netns", "exec", ns[i]], env={"LIFETIME": "0.3"})
    for a in cluster.agents:
        assert a.wait() == 0, a.text()
    (r,) = rounds(cluster.out)
    check_world(r, 2, [2, 2])
    assert {e["MASTER_ADDR"] for e in r} == {addrs[0]}
    assert "hosting the rendezvous" in cluster.agents[0].text()
    assert "hosting the rendezvous" not in cluster.agents[1].text()
