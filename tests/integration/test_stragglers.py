"""Stragglers (docs/status.md, "Stragglers"): real cddprun and cddp-rdzv
runs of cddp-train with a rank slowed by --fault slow@...,for=K.

  - two ranks on one agent: the slowed rank is named on its agent (the log
    line, /status's stragglers, /metrics), judged on compute: in DDP every
    rank's step lasts as long as the slowest one's, so step time alone
    names no one;
  - two agents of one rank each, through cddp-rdzv: the slowed node is
    named on the server (its log line, the run's stragglers, /metrics),
    from the summaries the agents' heartbeats carry.
"""
import json
import os
import re
import subprocess

import promparse
from conftest import binary, free_port, wait_for
from statusserver import curl

TRAIN = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "16", "--num-classes",
         "10", "--epochs", "1", "--batch-size", "4", "--log-every", "1000"]


def status(port):
    try:
        code, _, body = curl(f"http://127.0.0.1:{port}/status", timeout=5)
    except AssertionError:
        return None
    return json.loads(body) if code == 200 else None


def metrics(port):
    code, _, body = curl(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert code == 200
    return promparse.parse(body.decode(), conventions=True)


def env():
    # One thread each (the launcher sets it only for several local workers):
    # two single-rank agents must not fight over the machine's cores.
    return dict(os.environ, LOGLEVEL="INFO", OMP_NUM_THREADS="1")


def test_slowed_rank_named_on_its_agent(background, tmp_path):
    port = free_port()
    log = tmp_path / "agent.log"
    with open(log, "w") as fh:
        agent = background([binary("cddprun"), "--nproc_per_node=2", "--standalone",
                            f"--status_port={port}", f"--log_dir={tmp_path / 'logs'}",
                            binary("cddp-train"), *TRAIN, "--steps", "70",
                            "--fault", "slow@step=5,ms=150,rank=1,for=1000"],
                           env=env(), stdout=subprocess.DEVNULL, stderr=fh)

    def named():
        st = status(port)
        return st if st and st.get("stragglers") else None

    st = wait_for(named, timeout=150, interval=0.2, what="rank 1 named a straggler")
    m = metrics(port)
    # The run's history has the mark (the dashboard draws it).
    code, _, body = curl(f"http://127.0.0.1:{port}/history", timeout=5)
    marks = [e for e in json.loads(body)["events"] if e["kind"] == "straggler"]
    assert code == 200 and marks and marks[0]["local_rank"] == 1, marks
    assert marks[0]["value"] > 1.5 and "local_rank 1 (rank 1) a straggler" in marks[0]["reason"]
    assert agent.wait(150) == 0, log.read_text()[-3000:]
    (e,) = st["stragglers"]
    assert (e["rank"], e["local_rank"]) == (1, 1), e
    # Compute is the step's time less its wait on collectives, and on the
    # slowed rank that wait can overlap the 150 ms sleep by a few ms (CI saw
    # 0.147 s): the claim is "most of the sleep, and above the median by the
    # detector's factor", not "at least 150 ms" (under ASan the median is
    # 0.08 s and the slowed rank 2.8 times it).
    assert e["time_s"] > 0.1 and e["factor"] > 1.5, e
    assert e["median_s"] > 0, e
    det = st["straggler_detection"]
    assert det["basis"] == "compute" and det["factor"] == 1.5 and det["min_steps"] == 20, det
    w0, w1 = st["workers"]
    # DDP: both ranks' steps last as long (the slow one's); compute differs.
    assert abs(w0["step_time_s"] - w1["step_time_s"]) < 0.5 * w1["step_time_s"], (w0, w1)
    assert w1["compute_s"] > 1.5 * w0["compute_s"], (w0, w1)
    assert w1["progress"]["wait_s"] is not None and w0["progress"]["wait_s"] is not None
    assert [w["straggler"] for w in st["workers"]] == [False, True]
    assert promparse.value(m, "cddp_worker_straggler", local_rank="1") == 1
    assert promparse.value(m, "cddp_worker_compute_seconds", local_rank="1") > 0.1
    text = log.read_text()
    assert re.search(r"A0910: \[default\] local_rank 1 \(rank 1\) is a straggler: .*\(compute",
                     text), text[-3000:]
    assert "A0910: [default] local_rank 0" not in text


def test_slow_node_named_on_cddp_rdzv(background, tmp_path):
    sport = free_port()
    rlog = tmp_path / "rdzv.log"
    with open(rlog, "w") as fh:
        rz = background([binary("cddp-rdzv"), "--host", "127.0.0.1", "--port", "0",
                         "--status-port", str(sport)], env=env(), stdout=subprocess.PIPE,
                        stderr=fh)
    first = rz.proc.stdout.readline()
    assert "listening on" in first, first
    rport = int(first.split()[3].rsplit(":", 1)[1])
    agents = []
    for node in (0, 1):
        with open(tmp_path / f"agent{node}.log", "w") as fh:
            agents.append(background(
                [binary("cddprun"), "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                 f"--rdzv_endpoint=127.0.0.1:{rport}", "--rdzv_id=slowjob",
                 "--rdzv_conf=keep_alive_interval=0.5", f"--log_dir={tmp_path / f'logs{node}'}",
                 binary("cddp-train"), *TRAIN, "--steps", "80",
                 "--fault", "slow@step=5,ms=150,rank=1,for=1000"],
                env=env(), stdout=subprocess.DEVNULL, stderr=fh))

    def named():
        st = status(sport)
        runs = (st or {}).get("runs") or []
        return runs[0] if runs and runs[0].get("stragglers") else None

    run = wait_for(named, timeout=150, interval=0.2, what="the slow node named on cddp-rdzv")
    m = metrics(sport)
    for a in agents:
        assert a.wait(150) == 0, a.err
    (e,) = run["stragglers"]
    slow = next(n for n in run["members"] if n["straggler"])
    assert e["node"] == slow["node"] and e["rank"] == 1, (e, run["members"])
    # Compute is the step's time less its wait on collectives, and on the
    # slowed rank that wait can overlap the 150 ms sleep by a few ms (CI saw
    # 0.147 s): the claim is "most of the sleep, and above the median by the
    # detector's factor", not "at least 150 ms" (under ASan the median is
    # 0.08 s and the slowed rank 2.8 times it).
    assert e["time_s"] > 0.1 and e["factor"] > 1.5, e
    assert e["median_s"] > 0, e
    assert run["step_basis"] == "compute" and run["step_median_s"] == e["median_s"], run
    assert all(n["step_time_s"] > 0 for n in run["members"]), run["members"]
    assert promparse.value(m, "cddp_rdzv_stragglers", run_id="slowjob") == 1
    assert promparse.value(m, "cddp_rdzv_step_seconds", run_id="slowjob") > 0
    rz.signal(15)
    assert rz.wait(30) == 0
    text = rlog.read_text()
    assert re.search(r"R0024: run 'slowjob': node \S+ is a straggler: .* slowest rank 1\)",
                     text), text[-3000:]
