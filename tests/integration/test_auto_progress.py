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
                        [SEED, "--out", out, "--env-out", out / "env", "--epochs", "40"],
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
    # 256 samples, 16 a batch, 2 ranks: 8 optimizer steps an epoch, 40 epochs.
    for w in st["workers"]:
        p = w["progress"]
        assert p["source"] == "auto", p
        # every step counted, the last ones told at exit; at most a line a step
        assert p["step"] == 320 and 1 < p["lines"] <= 320 and p["malformed"] == 0, p
        assert p["step_time_s"] is not None and 0 < p["step_time_s"] < 5, p
        assert w["step_time_s"] is not None and w["step_time_s"] > 0, w
    # Advancing: each rank was seen on the way, before its last step (the
    # status is published at most every 250 ms while only lines come).
    assert all(any(0 < x < 320 for x in s) for s in seen.values()), seen
    m = metrics(port)
    for lr in ("0", "1"):
        assert promparse.value(m, "cddp_worker_progress_step", local_rank=lr) == 320
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
    assert res["world_size"] == 2 and len(res["losses"]) == 40


def test_hang_after_10_steps_caught_and_restarted(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    r = run([binary("cddprun"), "--nproc_per_node=2", f"--master_port={free_port()}",
             "--max_restarts=1", "--watchdog_timeout=auto", "--watchdog_floor=3",
             "--watchdog_warmup=3", f"--log_dir={tmp_path / 'logs'}", SCRIPT, "--out", out,
             "--ddp", "--steps", "30", "--step-s", "0.03", "--hang-rank", "1",
             "--hang-step", "10"],
            timeout=180, env=agent_env())
    assert r.returncode == 0, r.stderr[-4000:]
    hung = [line for line in r.stderr.splitlines() if "A0901" in line]
    assert len(hung) == 1, r.stderr[-4000:]
    # Caught after the 10 steps it made (30 ms apart: each one told), on the
    # timeout it learned (auto; the floor is 3 s here, so that a rank's exit
    # after its last step, a second or so on a busy machine, is not taken
    # for a hang).
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


# ---- the hook alone: python3 with the bootstrap folder, a pipe as the agent ----


def boot_dir():
    from conftest import BUILD
    d = BUILD / "python" / "autoprogress"
    assert (d / "sitecustomize.py").is_file(), d
    return d


def hooked(code, tmp_path, extra_path=(), fd_kind="pipe", python=None):
    """Runs code under a Python whose PYTHONPATH starts with the bootstrap
    folder and whose CDDP_PROGRESS_FD is a pipe this test reads (or a file,
    or closed): (exit code, stdout, stderr, the lines read)."""
    from conftest import TORCH_PY
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(boot_dir()), *map(str, extra_path)])
    r, w = os.pipe()
    fds = ()
    if fd_kind == "pipe":
        env["CDDP_PROGRESS_FD"] = str(w)
        fds = (w,)
    elif fd_kind == "file":
        f = open(tmp_path / "not_a_pipe", "w")
        env["CDDP_PROGRESS_FD"] = str(f.fileno())
        fds = (f.fileno(),)
    else:
        env["CDDP_PROGRESS_FD"] = "77"  # nothing open there
    p = subprocess.Popen([python or TORCH_PY, "-c", code], env=env, pass_fds=fds,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err, [json.loads(x) for x in data.decode().splitlines()]


STEPS = """
import os, time, torch
m = torch.nn.Linear(4, 2)
class Nested(torch.optim.SGD):
    def step(self, closure=None):      # a subclass's step calling its parent's
        return super().step(closure)
a = torch.optim.SGD(m.parameters(), lr=0.1)
b = Nested(m.parameters(), lr=0.1)
for i in range(3):
    m(torch.randn(2, 4)).sum().backward()
    a.step()
    time.sleep(0.03)    # a line a step: lines are at least 20 ms apart
    b.step()
    time.sleep(0.03)
pid = os.fork()
if pid == 0:            # a forked child's steps are not the worker's
    a.step(); os._exit(0)
os.waitpid(pid, 0)
print("done", os.environ.get("PYTHONPATH"))
"""


def test_hook_counts_every_optimizer_step_once(tmp_path):
    rc, out, err, lines = hooked(STEPS, tmp_path, extra_path=["/user/dir"])
    assert rc == 0 and out == "done /user/dir\n" and err == "", (out, err)
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6], lines
    assert all(x["auto"] is True for x in lines)
    assert "step_time_s" not in lines[0] and all(x["step_time_s"] >= 0 for x in lines[1:])


def test_hook_lines_at_most_every_20_ms(tmp_path):
    """A fast loop's steps are counted, told at most every 20 ms with their
    mean time, and the last ones at exit."""
    code = """
import time, torch
opt = torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1)
t0 = time.perf_counter()
for i in range(2000):
    opt.step()
    if i % 100 == 99:
        time.sleep(0.01)
print(time.perf_counter() - t0)
"""
    rc, out, err, lines = hooked(code, tmp_path)
    assert rc == 0 and err == "", err
    steps = [x["step"] for x in lines]
    assert steps[0] == 1 and steps[-1] == 2000 and steps == sorted(steps), steps
    assert len(lines) < 2000 * 0.2, len(lines)
    # Each line's mean covers the steps since the previous one: their sum
    # is about the loop's time (the first step's line has no time).
    told = sum(x["step_time_s"] * (x["step"] - p["step"]) for p, x in zip(lines, lines[1:]))
    assert abs(told - float(out)) < 0.2 * float(out) + 0.01, (told, out)


def test_hook_never_raises(tmp_path):
    for kind in ("file", "closed"):
        rc, out, err, lines = hooked(STEPS, tmp_path, fd_kind=kind)
        assert rc == 0 and out.startswith("done") and err == "", (kind, out, err)
        assert lines == []
    assert (tmp_path / "not_a_pipe").read_text() == ""  # a file is never written to
    # The agent gone mid-run (the pipe's reader closed): silent from then on.
    gone = """
import os, torch, time
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
fd = int(os.environ["CDDP_PROGRESS_FD"])
for i in range(5):
    opt.step()
    time.sleep(0.03)
os.close(fd)                            # the script closes it: EBADF from now on
for i in range(5):
    opt.step()
    time.sleep(0.03)
print("ok")
"""
    rc, out, err, lines = hooked(gone, tmp_path)
    assert (rc, out, err) == (0, "ok\n", ""), err
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5]
    # A user's sitecustomize that fails is reported as Python's site does;
    # the start goes on, and so does the hook.
    bad = tmp_path / "badsite"
    bad.mkdir()
    (bad / "sitecustomize.py").write_text("raise RuntimeError('user site broke')\n")
    rc, out, err, lines = hooked(STEPS, tmp_path, extra_path=[bad])
    assert rc == 0 and "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n" \
        "RuntimeError: user site broke" in err, err
    assert len(lines) == 6


def test_hook_on_torch_2_global_post_hook(tmp_path):
    """torch >= 2.0's register_optimizer_step_post_hook, through a stand-in
    torch package (torch 2 does not run on this machine: Debian 12 has
    1.13) that has the hook API and calls hooks as torch 2's Optimizer does."""
    fake = tmp_path / "fake" / "torch" / "optim"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("from torch import optim\n")
    (fake / "__init__.py").write_text("from torch.optim.optimizer import Optimizer\n")
    (fake / "optimizer.py").write_text(
        "_hooks = []\n"
        "def register_optimizer_step_post_hook(hook):\n"
        "    _hooks.append(hook)\n"
        "class Optimizer:\n"
        "    def step(self, *args, **kwargs):\n"
        "        for h in _hooks:\n"
        "            h(self, args, kwargs)\n")
    code = ("import time, torch\nopt = torch.optim.Optimizer()\nfor i in range(4):\n"
            "    opt.step()\n    time.sleep(0.03)\n"
            "assert type(opt).step is torch.optim.Optimizer.step\nprint('ok')\n")
    rc, out, err, lines = hooked(code, tmp_path, extra_path=[tmp_path / "fake"])
    assert (rc, out, err) == (0, "ok\n", ""), err
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
