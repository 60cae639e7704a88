"""Job-wide goodput and history on cddp-rdzv (docs/status.md, "Job-wide
goodput" and "Job-wide history"):

  - two agents of one rank each through cddp-rdzv, rank 0 crashing once
    (--fault crash@step=7,rank=0, a checkpoint every 4 steps): the server's
    /status and /metrics sum both nodes' goodput (productive within the sum
    of what the agents say themselves, a restart phase, a ratio between 0
    and 1), and GET /history?run= has the job's step advancing and the
    rounds and the restart;
  - an agent hosting the server (--standalone), its one rank crashing once:
    its /status's rdzv_server and its /metrics carry the run's job-wide
    goodput (cddp_goodput_ratio{run_id}), its GET /history?run= the job's
    history (step advancing, rounds, the restart), its GET /history still
    its own node's;
  - a peer sending bad goodput in its heartbeats (wrong type, negative,
    huge): ignored with one log line (R0026), the server lives, and a good
    one after it counts.
"""
import json
import os
import subprocess

import promparse
import pytest
from conftest import agent_status, binary, free_port, wait_for
from rdzv_wire import Peer
from statusserver import curl

TRAIN = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "16", "--num-classes",
         "10", "--epochs", "1", "--batch-size", "4", "--log-every", "1", "--steps", "16",
         "--ckpt-every", "4", "--fault", "crash@step=7,rank=0"]
PHASES = ["init", "productive", "lost", "restart", "rendezvous", "stopped"]


def get_json(url):
    code, _, body = curl(url, timeout=5)
    return code, (json.loads(body) if body.strip().startswith(b"{") else None)


def start_rdzv(background, tmp_path, sport):
    fh = open(tmp_path / "rdzv.log", "w")
    rz = background([binary("cddp-rdzv"), "--host", "127.0.0.1", "--port", "0",
                     "--status-port", str(sport)],
                    env=dict(os.environ, LOGLEVEL="INFO"), stdout=subprocess.PIPE, stderr=fh)
    first = rz.proc.stdout.readline()
    assert "listening on" in first, first
    return rz, int(first.split()[3].rsplit(":", 1)[1])


def run_of(sport, run_id):
    code, st = get_json(f"http://127.0.0.1:{sport}/status")
    assert code == 200
    return next((r for r in st["runs"] if r["run_id"] == run_id), None)


@pytest.mark.heavy  # two agents training with a restart: 40 s on a loaded 2-core machine
def test_two_nodes_goodput_and_history_on_cddp_rdzv(background, tmp_path):
    sport = free_port()
    rz, rport = start_rdzv(background, tmp_path, sport)
    env = dict(os.environ, LOGLEVEL="INFO", OMP_NUM_THREADS="1")
    ports, agents = [free_port(), free_port()], []
    for node in (0, 1):
        with open(tmp_path / f"agent{node}.log", "w") as fh:
            agents.append(background(
                [binary("cddprun"), "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                 f"--rdzv_endpoint=127.0.0.1:{rport}", "--rdzv_id=gpjob", "--max_restarts=1",
                 "--rdzv_conf=keep_alive_interval=0.5,last_call_timeout=0.5",
                 f"--log_dir={tmp_path / f'logs{node}'}",
                 f"--status_port={ports[node]}", "--status_linger=60", binary("cddp-train"),
                 *TRAIN, "--checkpoint", str(tmp_path / "ck.safetensors")],
                env=env, stdout=subprocess.DEVNULL, stderr=fh))
    finals = []
    for node, port in enumerate(ports):
        st = {}
        wait_for(lambda: (st.update(agent_status(port) or {}) or st.get("exit_code") is not None),
                 timeout=150, what=f"agent {node}'s end on /status")
        assert st["exit_code"] == 0, (tmp_path / f"agent{node}.log").read_text()[-3000:]
        finals.append(st["goodput"])
    run = run_of(sport, "gpjob")
    assert run is not None
    g = run["goodput"]
    assert g is not None and g["nodes"] == 2, run
    s = g["seconds"]
    assert set(s) == set(PHASES)
    own = {p: sum(f["seconds"][p] for f in finals) for p in PHASES}
    # The server has each node's totals of its last heartbeat: no more than
    # what the agents say at the end, and each node ran a while.
    assert 0 < s["productive"] <= own["productive"] + 0.01, (s, own)
    assert s["restart"] > 0 and s["init"] > 0, s
    assert 0 < g["ratio"] < 1, g
    assert abs(g["ratio"] - s["productive"] / g["total_s"]) < 1e-3, g
    assert abs(sum(s.values()) - g["total_s"]) < 0.01, g
    assert g["lost_steps"] <= sum(f["lost_steps"] for f in finals), (g, finals)

    code, _, body = curl(f"http://127.0.0.1:{sport}/metrics", timeout=5)
    assert code == 200
    m = promparse.parse(body.decode(), conventions=True)
    for p in PHASES:
        v = promparse.value(m, "cddp_time_seconds_total", run_id="gpjob", phase=p)
        assert abs(v - s[p]) < 1.0, (p, v, s[p])
    assert 0 < promparse.value(m, "cddp_goodput_ratio", run_id="gpjob") < 1

    code, h = get_json(f"http://127.0.0.1:{sport}/history?run=gpjob")
    assert code == 200 and len(h["series"]) == 2, h
    top = [p[2] for p in h["series"][0]["points"]]
    # (the last point is the end's, with the job's last step: the agent beats
    # once more before it closes the rendezvous)
    assert len(top) >= 2 and top[-1] > top[0] and top[-1] == 16, top
    kinds = [e["kind"] for e in h["events"]]
    rounds = [e for e in h["events"] if e["kind"] == "round"]
    assert len(rounds) >= 2 and rounds[0]["reason"] == "2 nodes, world size 2", h["events"]
    restarts = [e for e in h["events"] if e["kind"] == "restart"]
    assert restarts and restarts[0]["reason"].startswith("worker_failure"), kinds
    # since=N: only what is newer.
    code, h2 = get_json(f"http://127.0.0.1:{sport}/history?run=gpjob&since={h['seq']}")
    assert code == 200 and h2["events"] == [], h2
    for a in agents:
        a.signal(15)
        assert a.wait(30) == 0
    assert rz.proc.poll() is None


def test_bad_goodput_ignored_by_cddp_rdzv(background, tmp_path):
    sport = free_port()
    rz, rport = start_rdzv(background, tmp_path, sport)
    with Peer("127.0.0.1", rport) as p:
        assert p.hello("badjob")["type"] == "welcome"
        p.join("n1", 1, 1)
        p.expect("round")
        for bad in ("x", [1], {"productive_s": -1}, {"init_s": 1e300},
                    {"lost_steps": "many"}, {"step": -5}, {"restart_s": True}):
            p.send("heartbeat", goodput=bad)
        # The heartbeats still count: the node stays, the server answers.
        wait_for(lambda: run_of(sport, "badjob") is not None, timeout=10, what="the run")
        assert run_of(sport, "badjob")["goodput"] is None
        p.send("heartbeat", goodput={"productive_s": 5, "restart_s": 1, "step": 3})

        def counted():
            g = (run_of(sport, "badjob") or {}).get("goodput")
            return g if g and g["nodes"] == 1 else None

        g = wait_for(counted, timeout=10, what="the good goodput counted")
        assert g["seconds"]["productive"] == 5 and g["max_step"] == 3, g
        assert abs(g["ratio"] - 5 / 6) < 1e-3, g
        code, h = get_json(f"http://127.0.0.1:{sport}/history?run=badjob")
        assert code == 200 and h["series"][0]["points"][-1][2] == 3, h
    assert rz.proc.poll() is None
    assert curl(f"http://127.0.0.1:{sport}/history", timeout=5)[0] == 400
    assert curl(f"http://127.0.0.1:{sport}/history?run=nosuch", timeout=5)[0] == 404
    rz.signal(15)
    rz.wait(20)
    log = (tmp_path / "rdzv.log").read_text()
    assert log.count("R0026") == 1, log  # once a connection
    assert "heartbeat's goodput ignored" in log


SOLO = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "16", "--num-classes",
        "10", "--epochs", "1", "--batch-size", "4", "--log-every", "1", "--steps", "12",
        "--ckpt-every", "4", "--fault", "crash@step=6,rank=0"]


def jobwide_ratio(port, run_id):
    """The agent's cddp_goodput_ratio{run_id} when strictly between 0 and 1, else None."""
    code, _, body = curl(f"http://127.0.0.1:{port}/metrics", timeout=5)
    if code != 200:
        return None
    m = promparse.parse(body.decode(), conventions=True)
    try:
        v = promparse.value(m, "cddp_goodput_ratio", run_id=run_id)
    except KeyError:
        return None
    # The node's own ratio stays, unlabelled, in the same family.
    assert 0 <= promparse.value(m, "cddp_goodput_ratio") <= 1
    return (m, v) if 0 < v < 1 else None


def test_agent_hosting_the_server_keeps_job_wide_goodput_and_history(background, tmp_path):
    port = free_port()
    env = dict(os.environ, LOGLEVEL="INFO", OMP_NUM_THREADS="1")
    with open(tmp_path / "agent.log", "w") as fh:
        a = background([binary("cddprun"), "--standalone", "--nproc_per_node=1",
                        "--max_restarts=1", "--rdzv_conf=keep_alive_interval=0.5",
                        f"--log_dir={tmp_path / 'logs'}", f"--status_port={port}",
                        "--status_linger=60", binary("cddp-train"), *SOLO, "--checkpoint",
                        str(tmp_path / "ck.safetensors")],
                       env=env, stdout=subprocess.DEVNULL, stderr=fh)
    run_id = wait_for(lambda: (agent_status(port) or {}).get("run_id"), timeout=20,
                      what="the agent's run id")
    # While the run goes on: the hosted server's sums, on /metrics and /status.
    m, ratio = wait_for(lambda: jobwide_ratio(port, run_id), timeout=60,
                        what="cddp_goodput_ratio{run_id} on the agent's /metrics")
    assert 0 < ratio < 1
    for p in PHASES:
        assert promparse.value(m, "cddp_time_seconds_total", run_id=run_id, phase=p) >= 0
    st = agent_status(port)
    runs = (st.get("rdzv_server") or {}).get("runs") or []
    g = next((r["goodput"] for r in runs if r["run_id"] == run_id), None)
    assert g is not None and g["nodes"] == 1 and 0 <= g["ratio"] <= 1, st.get("rdzv_server")
    assert set(g["seconds"]) == set(PHASES)

    st = {}
    wait_for(lambda: (st.update(agent_status(port) or {}) or st.get("exit_code") is not None),
             timeout=90, what="the agent's end on /status")
    assert st["exit_code"] == 0, (tmp_path / "agent.log").read_text()[-3000:]
    # The job's history outlives the hosted server (the agent lingers).
    code, h = get_json(f"http://127.0.0.1:{port}/history?run={run_id}")
    assert code == 200 and len(h["series"]) == 2, h
    top = [p[2] for p in h["series"][0]["points"]]
    # (the last point is the end's, with the job's last step: the agent beats
    # once more before it closes the rendezvous)
    assert len(top) >= 2 and top[-1] > top[0] and top[-1] == 12, top
    rounds = [e for e in h["events"] if e["kind"] == "round"]
    assert len(rounds) >= 2 and rounds[0]["reason"].endswith("world size 1"), h["events"]
    restarts = [e for e in h["events"] if e["kind"] == "restart"]
    assert restarts and restarts[0]["reason"].startswith("worker_failure"), h["events"]
    # Without run=: the node's own history (one series: its one rank).
    code, own = get_json(f"http://127.0.0.1:{port}/history")
    assert code == 200 and len(own["series"]) == 1, own
    assert curl(f"http://127.0.0.1:{port}/history?run=nosuch", timeout=5)[0] == 404
    a.signal(15)
    assert a.wait(20) == 0
