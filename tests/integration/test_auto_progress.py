"""Progress without code changes (docs/status.md, "Progress without code
changes"): real cddprun runs of unmodified PyTorch scripts (Debian's torch
1.13) whose steps only cddprun's bootstrap sitecustomize reports.

  - the seeds' DDP script (tests/compat/ddp_train.py, as it is): every
    rank's step advances on /status and /metrics, with its step time; the
    script sees the PYTHONPATH it was given;
  - a seed-style script whose rank 1 stops after 10 steps, under
    --watchdog_timeout=auto: caught, its stacks taken, the group restarted,
    the second attempt finishes;
  - a user's own sitecustomize still runs (and the hook too);
  - a script that writes its own progress lines: the hook stands aside;
    --no_auto_progress: no hook at all;
  - a non-DDP script whose rank 1 sleeps 0.2 s more a step is named a
    straggler (docs/status.md, "Stragglers").
"""
import json
import os
import re
import subprocess
import time

import pytest

import promparse
from conftest import ROOT, binary, free_port, run, wait_for
from statusserver import curl

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "auto_progress_train.py")
SEED = ROOT / "tests" / "compat" / "ddp_train.py"


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


def agent_env(**extra):
    env = dict(os.environ, LOGLEVEL="INFO")
    env.update(extra)
    return env


def start(background, tmp_path, args, script_args, env=None, nproc=2):
    """cddprun in the background, its stderr in tmp_path/agent.log; the
    status port's number."""
    port = free_port()
    log = open(tmp_path / "agent.log", "w")
    agent = background([binary("cddprun"), f"--nproc_per_node={nproc}",
                        f"--master_port={free_port()}", f"--status_port={port}",
                        f"--log_dir={tmp_path / 'logs'}", *args, *script_args],
                       env=env or agent_env(), stdout=subprocess.DEVNULL, stderr=log)
    return agent, port


def log_of(tmp_path):
    return (tmp_path / "agent.log").read_text(errors="replace")


def ranks(out, n=2):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_seed_script_steps_on_status(background, tmp_path):
    out = tmp_path / "out"
    (out / "env").mkdir(parents=True)
    agent, port = start(background, tmp_path, ["--status_linger=60"],
                        [SEED, "--out", out, "--env-out", out / "env", "--epochs", "20"],
                        env=agent_env(PYTHONPATH="/nonexistent/user/dir"))
    seen = {0: set(), 1: set()}

    def finished():
        st = status(port)
        for w in (st or {}).get("workers", []):
            if (w.get("progress") or {}).get("step") is not None:
                seen[w["local_rank"]].add(w["progress"]["step"])
        return st if st and st["state"] in ("succeeded", "failed") else None

    st = wait_for(finished, timeout=120, interval=0.05, what="the seed script's end")
    assert st["state"] == "succeeded", log_of(tmp_path)[-3000:]
    # 256 samples, 16 a batch, 2 ranks: 8 optimizer steps an epoch, 20 epochs.
    for w in st["workers"]:
        p = w["progress"]
        assert p["source"] == "auto", p
        assert p["step"] == 160 and p["lines"] == 160 and p["malformed"] == 0, p
        assert p["step_time_s"] is not None and 0 < p["step_time_s"] < 5, p
        assert w["step_time_s"] is not None and w["step_time_s"] > 0, w
    # Advancing: each rank was seen at several steps on the way.
    assert all(len(s) >= 3 for s in seen.values()), seen
    m = metrics(port)
    for lr in ("0", "1"):
        assert promparse.value(m, "cddp_worker_progress_step", local_rank=lr) == 160
        assert promparse.value(m, "cddp_worker_step_seconds", local_rank=lr) > 0
    r = run([binary("cddpctl"), "status", f"127.0.0.1:{port}"], timeout=30)
    assert r.returncode == 0 and "STEP TIME" in r.stdout, r.stdout + r.stderr
    agent.signal(15)
    assert agent.wait(30) == 0
    log = log_of(tmp_path)
    assert "L0005: automatic progress is on" in log, log[-2000:]
    # The script saw its own PYTHONPATH, not the bootstrap folder.
    for r in range(2):
        env = json.loads((out / "env" / f"rank{r}.json").read_text())["env"]
        assert env["PYTHONPATH"] == "/nonexistent/user/dir", env.get("PYTHONPATH")
    res = json.loads((out / "result.json").read_text())
    assert res["world_size"] == 2 and len(res["losses"]) == 20


def test_hang_after_10_steps_caught_and_restarted(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    r = run([binary("cddprun"), "--nproc_per_node=2", f"--master_port={free_port()}",
             "--max_restarts=1", "--watchdog_timeout=auto", "--watchdog_floor=3",
             "--watchdog_warmup=3", f"--log_dir={tmp_path / 'logs'}", SCRIPT, "--out", out,
             "--ddp", "--steps", "30", "--hang-rank", "1", "--hang-step", "10"],
            timeout=180, env=agent_env())
    assert r.returncode == 0, r.stderr[-4000:]
    hung = [line for line in r.stderr.splitlines() if "A0901" in line]
    assert len(hung) == 1, r.stderr[-4000:]
    # Caught after the 10 steps it made, on the timeout it learned (auto;
    # the floor is 3 s here, so that a rank's exit after its last step,
    # which takes a second or so on a busy machine, is not taken for a hang).
    assert re.search(r"after step 10 \(timeout 3\.0 s, auto\)", hung[0]), hung[0]
    stacks = list((tmp_path / "logs").glob("*/attempt_0/*/stacks.txt"))
    assert len(stacks) == 1 and stacks[0].stat().st_size > 0, stacks
    res = ranks(out)
    assert [x["attempt"] for x in res] == [1, 1] and [x["steps"] for x in res] == [30, 30]
    assert time.monotonic() - t0 < 170


def test_user_sitecustomize_still_runs(background, tmp_path):
    user = tmp_path / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text(
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\nUSER_MARK = 'mine'\n")
    out = tmp_path / "out"
    out.mkdir()
    agent, port = start(background, tmp_path, ["--status_linger=60"],
                        [SCRIPT, "--out", out, "--steps", "25"],
                        env=agent_env(PYTHONPATH=str(user)), nproc=1)
    st = wait_for(lambda: (lambda s: s if s and s["state"] == "succeeded" else None)(status(port)),
                  timeout=120, interval=0.1, what="the run's end")
    agent.signal(15)
    assert agent.wait(30) == 0
    (res,) = ranks(out, 1)
    assert res["user_site_env"] == "1" and res["user_site_mark"] == "mine", res
    assert res["sitecustomize"] == str(user / "sitecustomize.py"), res
    assert res["pythonpath"] == str(user), res
    assert not any("autoprogress" in p for p in res["sys_path"]), res["sys_path"]
    p = st["workers"][0]["progress"]
    assert p["source"] == "auto" and p["step"] == 25, p


def test_own_progress_lines_hook_stands_aside(background, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    agent, port = start(background, tmp_path, ["--status_linger=60"],
                        [SCRIPT, "--out", out, "--steps", "25", "--own-progress"], nproc=1)
    st = wait_for(lambda: (lambda s: s if s and s["state"] == "succeeded" else None)(status(port)),
                  timeout=120, interval=0.1, what="the run's end")
    agent.signal(15)
    assert agent.wait(30) == 0
    p = st["workers"][0]["progress"]
    # The script's own 26 lines, and none of the hook's 25.
    assert p["source"] == "worker" and p["step"] == 1025 and p["loss"] is not None, p
    assert p["lines"] == 26 and p["malformed"] == 0, p


def test_no_auto_progress(background, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    agent, port = start(background, tmp_path, ["--status_linger=60", "--no_auto_progress"],
                        [SCRIPT, "--out", out, "--steps", "5"], nproc=1)
    st = wait_for(lambda: (lambda s: s if s and s["state"] == "succeeded" else None)(status(port)),
                  timeout=120, interval=0.1, what="the run's end")
    agent.signal(15)
    assert agent.wait(30) == 0
    assert st["workers"][0]["progress"] is None, st["workers"][0]
    assert "L0005" not in log_of(tmp_path)


def test_non_ddp_slow_rank_named(background, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stop = tmp_path / "stop"
    agent, port = start(background, tmp_path, ["--straggler_factor=1.5"],
                        [SCRIPT, "--out", out, "--steps", "1", "--until", stop,
                         "--step-s", "0.02", "--slow-rank", "1", "--slow-s", "0.2"])

    def named():
        st = status(port)
        return st if st and st.get("stragglers") else None

    st = wait_for(named, timeout=120, interval=0.2, what="rank 1 named a straggler")
    m = metrics(port)
    stop.write_text("")
    assert agent.wait(60) == 0, log_of(tmp_path)[-3000:]
    (e,) = st["stragglers"]
    assert (e["rank"], e["local_rank"]) == (1, 1), e
    assert e["time_s"] > 0.2 and e["factor"] > 1.5 and e["since"] > 0, e
    assert st["straggler_detection"]["basis"] == "step_time", st["straggler_detection"]
    assert [w["straggler"] for w in st["workers"]] == [False, True]
    assert promparse.value(m, "cddp_worker_straggler", local_rank="1") == 1
    assert promparse.value(m, "cddp_worker_straggler", local_rank="0") == 0
    log = log_of(tmp_path)
    assert re.search(r"A0910: \[default\] local_rank 1 \(rank 1\) is a straggler", log), log[-3000:]
