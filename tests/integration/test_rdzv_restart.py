"""A rendezvous server restart that keeps healthy workers running.

Real cddprun agents (one process per "node", on loopback) against a real
cddp-rdzv, which is SIGKILLed and started again on the same port, or
stopped on purpose (SIGUSR2, an upgrade) and started again, while the
workers train. The workers are a shell script that records its environment
(as test_elastic.py's) and then reports a step every 0.1 s on its progress
channel, so each agent's /status shows every worker's pid, step and
restarts, and the agent's round, restart count and reconnections.

What is asserted (docs/protocol.md, "A restarted server"):
  - every node comes back: no worker restarts (same pids, steps go on, no new
    worker start, the round number and every restart counter unchanged),
    and the rebuilt round is a live one (a node lost afterwards makes the
    survivor go on without it);
  - the same after a graceful restart (SIGUSR2; --keep-runs-on-exit makes
    SIGTERM do it), which tells the agents nothing;
  - a node missing after the restart: the others go on without it in a new
    round once resume_timeout passes, not counted against --max_restarts.
"""
import json
import signal
import time
import urllib.request

import pytest

from conftest import free_port, wait_for
from test_elastic import FAST, WORKER, alive, c10d, check_world, cluster, daemon, snapshot, \
    stop, wait_round  # noqa: F401 (fixtures)

PROGRESS = WORKER.replace('exec sleep "${LIFETIME:-3600}"', r'''i=0
while :; do
    echo "{\"step\":$i}" >&"$CDDP_PROGRESS_FD"
    i=$((i + 1))
    sleep 0.1
done''')


def status(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        return json.loads(r.read())


class Node:
    """An agent of the job with its status port."""

    def __init__(self, cluster, name, rdzv_port, nnodes, conf, tmp):
        self.sport = free_port()
        script = tmp / "progress.sh"
        if not script.exists():
            script.write_text(PROGRESS)
            script.chmod(0o755)
        self.agent = cluster.agent(name, *c10d(rdzv_port, nnodes, conf=conf,
                                                status_port=self.sport), script=script)

    def status(self):
        return status(self.sport)

    def steps(self):
        """{pid: step} of its workers (None before their first report)."""
        return {w["pid"]: (w["progress"] or {}).get("step") for w in self.status()["workers"]}


def running(nodes):
    """Waits until every worker of every node reports steps; returns the
    status pages."""
    def ready():
        sts = [n.status() for n in nodes]
        ok = all(s["state"] == "running" and s["workers"] and
                 all(w.get("pid") and w["progress"] and w["progress"].get("step", 0) >= 2
                     for w in s["workers"]) for s in sts)
        return sts if ok else None
    return wait_for(ready, timeout=30, what="every worker reporting steps")


def check_untouched(nodes, before, steps_before):
    """The workers of `before` (status pages) run on as they were."""
    for n, b in zip(nodes, before):
        s = n.status()
        assert s["round"] == b["round"]
        assert s["restarts"]["count"] == b["restarts"]["count"] == 0
        assert all(v == 0 for v in s["restarts"]["by_reason"].values()), s["restarts"]
        assert [w["pid"] for w in s["workers"]] == [w["pid"] for w in b["workers"]]
        assert all(w["restarts"] == 0 and w["state"] == "running" for w in s["workers"])
        assert all(alive(w["pid"]) for w in s["workers"])
    # Training went on: every worker's step moved past where it was.
    now = [n.steps() for n in nodes]
    for old, new in zip(steps_before, now):
        for pid, step in old.items():
            assert new[pid] is not None and new[pid] > step, (old, new)


def kept_round_after(restart, cluster, daemon, tmp_path):
    """Two nodes in round 1; restart(d) takes the daemon away and brings it
    back on the same port; every worker must run on untouched. Returns the
    two nodes and the daemon."""
    d = daemon()
    conf = "is_host=0," + FAST
    nodes = [Node(cluster, str(i), d.port, "1:2", conf, tmp_path) for i in range(2)]
    first = wait_round(cluster.out, 4)
    check_world(first, 2, [2, 2])
    before = running(nodes)
    assert all(s["round"] == 1 and s["rdzv"]["reconnects"] == 0 for s in before)
    starts = snapshot(cluster.out)
    steps = [n.steps() for n in nodes]
    restart(d)
    t0 = time.monotonic()
    for n in nodes:
        n.agent.wait_log("still in round 1; the workers keep running")
    rebuilt_s = time.monotonic() - t0
    wait_for(lambda: all(n.status()["rdzv"]["reconnects"] == 1 and n.status()["rdzv"]["connected"]
                         for n in nodes), what="both agents reconnected")
    time.sleep(1.0)  # past resume_timeout (0.6 s here): nothing may follow
    assert snapshot(cluster.out) == starts, "no worker was started again"
    check_untouched(nodes, before, steps)
    for n in nodes:
        assert "will restart worker group" not in n.agent.text()
    print(f"round rebuilt {rebuilt_s:.2f} s after the new daemon came up")
    return nodes, d, starts


def test_rdzv_sigkill_and_restart_keeps_every_worker(cluster, daemon, tmp_path):
    """cddp-rdzv SIGKILLed during training and started again on its port:
    the agents re-register their round, the new daemon rebuilds it, and no
    worker restarts. The rebuilt round is live: a node SIGKILLed afterwards
    makes the other go on without it (a node loss, not counted)."""
    def kill_and_start(d):
        d.kill()
        d.start()

    nodes, d, starts = kept_round_after(kill_and_start, cluster, daemon, tmp_path)
    nodes[1].agent.signal(signal.SIGKILL)
    second = wait_round(cluster.out, 2, ignore=starts)
    check_world(second, 1, [2])
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in second} == {"0"}
    nodes[0].agent.wait_log("rendezvous complete: round 2")
    stop(nodes[0].agent)
    d.stop()


def test_rdzv_graceful_restart_keeps_every_worker(cluster, daemon, tmp_path):
    """SIGUSR2 stops cddp-rdzv for a successor (exit 0, no run closed, the
    agents told nothing); the one started next on the port takes the job
    over without a worker restart."""
    def upgrade(d):
        d.signal(signal.SIGUSR2)
        assert d.p.wait(timeout=20) == 0
        d.start()

    nodes, d, _ = kept_round_after(upgrade, cluster, daemon, tmp_path)
    for n in nodes:
        assert "the rendezvous closed" not in n.agent.text()
    # And once more, the way a service manager restarts: SIGTERM with
    # --keep-runs-on-exit.
    d.kill()
    d.args = ["--keep-runs-on-exit"]
    d.start()
    for n in nodes:
        wait_for(lambda: n.status()["rdzv"]["reconnects"] == 2, what="the second reconnection")
    d.p.send_signal(signal.SIGTERM)
    assert d.p.wait(timeout=20) == 0
    d.start()
    for n in nodes:
        wait_for(lambda: n.status()["rdzv"]["reconnects"] == 3 and n.status()["rdzv"]["connected"],
                 what="the third reconnection")
    time.sleep(1.0)
    for n in nodes:
        s = n.status()
        assert s["round"] == 1 and s["restarts"]["count"] == 0
        assert all(w["restarts"] == 0 for w in s["workers"])
        assert "will restart worker group" not in n.agent.text()
    stop(*(n.agent for n in nodes))
    d.stop()


def test_rdzv_restart_with_a_node_missing_goes_on_without_it(cluster, daemon, tmp_path):
    """The daemon is killed, and so is one node while it is down: the node
    that comes back re-registers the round, waits resume_timeout (1 s) for
    the missing one, then restarts its workers in a new round without it
    (not counted: TORCHELASTIC_RESTART_COUNT stays 0)."""
    d = daemon()
    conf = "is_host=0,resume_timeout=1," + FAST
    nodes = [Node(cluster, str(i), d.port, "1:2", conf, tmp_path) for i in range(2)]
    wait_round(cluster.out, 4)
    running(nodes)
    starts = snapshot(cluster.out)
    d.kill()
    nodes[1].agent.signal(signal.SIGKILL)
    nodes[0].agent.wait_log("reconnecting")
    d.start()
    t0 = time.monotonic()
    second = wait_round(cluster.out, 2, ignore=starts)
    took = time.monotonic() - t0
    check_world(second, 1, [2])
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in second} == {"0"}
    assert {e["NODE"] for e in second} == {"0"}
    a = nodes[0].agent
    a.wait_log("rendezvous complete: round 2")
    assert "did not come back to the restarted rendezvous server" in a.text()
    s = nodes[0].status()
    assert s["restarts"]["count"] == 0
    assert took >= 0.9, f"the new round came {took:.2f} s after the daemon, before resume_timeout"
    print(f"new round without the missing node {took:.2f} s after the daemon came up")
    stop(a)
    d.stop()
