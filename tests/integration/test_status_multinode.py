"""The status port of multi-node cddprun agents (c10d): real agents on
loopback with real workers, fetched with curl, cddpctl and the strict
metrics parser.

What is asserted: the "rendezvous" state while a node waits for the others
(/readyz 503 with the failing checks named, /livez 200), then ready once the
round forms; the run's wait list in waiting_nodes on the hosting agent and
on one that only joins (the server's answers to heartbeats); the rendezvous
server an agent hosts on that agent's /status and /metrics; the exit
barrier state; and a hosting agent whose workers are done but that still
serves the other nodes stays live (/livez 200, its status refreshed).
"""
import json
import os
import signal

import promparse
from conftest import binary, free_port, run, wait_for
from statusserver import cddpctl, curl
from test_elastic import FAST, c10d, cluster, rounds, wait_round  # noqa: F401 (fixture)

PROM_CTYPE = "text/plain; version=0.0.4; charset=utf-8"

# Records its start like test_elastic's worker, then lives until the test
# writes $OUT/release.$NODE.
WORKER = r"""#!/bin/sh
f="$OUT/w.$$"
{ env | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_RESTART_COUNT|TORCHELASTIC_RUN_ID|TORCHELASTIC_USE_AGENT_STORE|NODE)='
  echo "PID=$$"; } > "$f.tmp" && mv "$f.tmp" "$f.env"
while [ ! -e "$OUT/release.$NODE" ]; do sleep 0.05; done
"""


def status(port):
    """The /status JSON, or None while nothing is published (or served)."""
    try:
        code, _, body = curl(f"http://127.0.0.1:{port}/status", timeout=5)
    except AssertionError:
        return None
    return json.loads(body) if code == 200 else None


def wait_status(port, pred, what, timeout=20):
    def ok():
        st = status(port)
        return st if st and pred(st) else None
    return wait_for(ok, timeout=timeout, what=what)


def metrics(port):
    code, headers, body = curl(f"http://127.0.0.1:{port}/metrics")
    assert code == 200 and headers["content-type"] == PROM_CTYPE
    return promparse.parse(body.decode(), conventions=True)


def readyz(port):
    code, _, body = curl(f"http://127.0.0.1:{port}/readyz?verbose")
    return code, body.decode()


def worker_script(cluster):
    w = cluster.tmp / "held.sh"
    w.write_text(WORKER)
    w.chmod(0o755)
    return w


def release(cluster, node):
    (cluster.out / f"release.{node}").write_text("")


def test_rendezvous_wait_list_and_hosted_server(cluster):
    port, sport, sport1 = free_port(), free_port(), free_port()
    w = worker_script(cluster)
    args = lambda host, sp: c10d(port, 2, conf=f"is_host={host}," + FAST,  # noqa: E731
                                 status_port=sp)
    host = cluster.agent("0", *args(1, sport), script=w)

    # ---- one node of two: rendezvous, not ready, alive ----
    st = wait_status(sport, lambda s: s["state"] == "rendezvous", "state rendezvous")
    assert st["ready"] is False and st["round"] == 0 and st["node_rank"] is None
    code, body = readyz(sport)
    assert code == 503
    assert "[+]loop ok\n" in body
    assert "[-]rendezvous failed: agent state: rendezvous, no round yet\n" in body
    assert "[-]workers failed: worker group is not running (agent state: rendezvous)\n" in body
    assert curl(f"http://127.0.0.1:{sport}/livez")[0] == 200
    r = cddpctl("health", f"127.0.0.1:{sport}")
    assert r.returncode == 1 and "[-]rendezvous failed" in r.stdout
    m = metrics(sport)
    assert promparse.value(m, "cddp_agent_state", state="rendezvous") == 1
    assert promparse.value(m, "cddp_agent_ready") == 0
    # It hosts the rendezvous: the run forms there, with this node in it
    # (the section is refreshed every second).
    st = wait_status(sport, lambda s: s["rdzv_server"]["runs"], "the run on the hosted server")
    assert st["state"] == "rendezvous"
    hosted = st["rdzv_server"]
    assert hosted["ready"] is True and hosted["endpoint"] == f"127.0.0.1:{port}"
    (run,) = hosted["runs"]
    assert (run["run_id"], run["state"], run["round"], run["min_nodes"], run["max_nodes"]) == (
        "job", "forming", 1, 2, 2)
    assert [n["state"] for n in run["members"]] == ["participant"] and run["waiting"] == []
    assert st["rdzv"]["connected"] is True and st["rdzv"]["reconnects"] == 0

    # ---- the second node: the round forms, both ready ----
    other = cluster.agent("1", *args(0, sport1), script=w)
    st = wait_status(sport, lambda s: s["state"] == "running", "state running")
    assert readyz(sport) == (200, "[+]loop ok\n[+]rendezvous ok\n[+]workers ok\n"
                                  "readyz check passed\n")
    assert (st["round"], st["nnodes"], st["world_size"]) == (1, 2, 4)
    (run,) = st["rdzv_server"]["runs"]
    assert run["state"] == "running" and run["last_round_at"] >= st["started_at"]
    assert sorted((n["node_rank"], n["state"]) for n in run["members"]) == [
        (0, "active"), (1, "active")]
    assert st["rdzv_server"]["connections"] == 2 and st["rdzv_server"]["rounds_total"] == 1
    st1 = wait_status(sport1, lambda s: s["state"] == "running", "node 1 running")
    assert st1["rdzv_server"] is None  # it only joins
    assert st1["waiting_nodes"] == 0

    # ---- a third at max waits: both agents see the wait list ----
    late = cluster.agent("2", *c10d(port, 2, conf="is_host=0," + FAST), script=w)
    late.wait_log("waits for a place")
    for sp in (sport, sport1):
        st = wait_status(sp, lambda s: s["waiting_nodes"] == 1, "waiting_nodes 1")
        assert st["state"] == "running"
        assert promparse.value(metrics(sp), "cddp_agent_rdzv_waiting_nodes") == 1
    (run,) = status(sport)["rdzv_server"]["runs"]
    (waiting,) = run["waiting"]
    assert waiting["state"] == "waiting" and waiting["node_rank"] is None
    m = metrics(sport)
    assert promparse.value(m, "cddp_rdzv_waiting_nodes", run_id="job") == 1
    assert promparse.value(m, "cddp_rdzv_members", run_id="job") == 2
    assert promparse.value(m, "cddp_rdzv_connections") == 3
    assert promparse.value(m, "cddp_agent_rdzv_connected") == 1
    r = cddpctl("status", f"127.0.0.1:{sport}")
    assert r.returncode == 0, r.stderr
    assert "1 waiting" in r.stdout and "hosting   the rendezvous server" in r.stdout
    assert "job" in r.stdout.split("hosting")[1]

    # ---- it gives up: the list is empty again ----
    late.signal(signal.SIGTERM)
    assert late.wait() == 128 + signal.SIGTERM
    wait_status(sport1, lambda s: s["waiting_nodes"] == 0, "waiting_nodes 0")
    assert len(rounds(cluster.out)) == 1, "the running round never noticed"
    for node in ("0", "1"):
        release(cluster, node)
    assert other.wait() == 0, other.text()
    assert host.wait() == 0, host.text()


def test_exit_barrier_then_serving_the_others(cluster):
    """The hosting node's workers finish first: it shows exit_barrier (not
    ready, alive); its barrier times out and it keeps serving the other node
    (state succeeded, still live: its loop and status tick on); it exits when
    that node is done."""
    port, sport = free_port(), free_port()
    w = worker_script(cluster)
    host = cluster.agent("0", *c10d(port, 2, conf="is_host=1," + FAST, status_port=sport),
                         script=w, env={"CDDP_EXIT_BARRIER_TIMEOUT": "1.5"})
    other = cluster.agent("1", *c10d(port, 2, conf="is_host=0," + FAST), script=w)
    wait_round(cluster.out, 4)
    release(cluster, "0")
    st = wait_status(sport, lambda s: s["state"] == "exit_barrier", "state exit_barrier")
    assert st["ready"] is False
    assert [x["state"] for x in st["workers"]] == ["succeeded", "succeeded"]
    code, body = readyz(sport)
    assert code == 503
    assert "[-]workers failed: worker group is not running (agent state: exit_barrier)\n" in body
    assert "[+]rendezvous ok\n" in body
    assert curl(f"http://127.0.0.1:{sport}/livez")[0] == 200

    host.wait_log("keeps serving the rendezvous")
    # Its own node has left the run; the other one still runs there.
    st = wait_status(sport, lambda s: s["state"] == "succeeded" and len(
        s["rdzv_server"]["runs"][0]["members"]) == 1, "state succeeded, one member left")
    (member,) = st["rdzv_server"]["runs"][0]["members"]
    assert (member["node_rank"], member["state"]) == (1, "active")
    # Still alive while it serves: the status is refreshed every second.
    t0 = st["generated_at"]
    st = wait_status(sport, lambda s: s["generated_at"] >= t0 + 1.0, "a refreshed status", 10)
    assert st["state"] == "succeeded"
    assert curl(f"http://127.0.0.1:{sport}/livez")[0] == 200
    m = metrics(sport)
    assert promparse.value(m, "cddp_status_loop_heartbeat_age_seconds") < 2.5
    assert host.bg.proc.poll() is None
    release(cluster, "1")
    assert other.wait() == 0, other.text()
    assert host.wait() == 0, host.text()
    assert len(rounds(cluster.out)) == 1


def test_linger_without_status_port_is_refused():
    """--status_linger without --status_port: a usage error; from the
    environment only a warning."""
    r = run([binary("cddprun"), "--status_linger=5", "/bin/true"], timeout=30)
    assert r.returncode == 2
    assert "--status_linger=5 needs --status_port" in r.stderr
    r = run([binary("cddprun"), "/bin/true"], timeout=30,
            env=dict(os.environ, CDDP_STATUS_LINGER="5"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("L0003") == 1 and "CDDP_STATUS_LINGER=5 has no effect" in r.stderr
