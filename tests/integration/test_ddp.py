"""cddp-train's DDP over real processes: cddprun (or torchrun's environment
set by hand), the bootstrap store on loopback, real gloo.

What they assert:
  - 4 ranks that trained on different samples (their losses differ) end
    with the same model: the per-rank state checksums are equal;
  - overlapping the bucket allreduces with backward changes nothing: the
    weights after --no-overlap are bitwise those with the overlap;
  - --accum-steps K reduces only on the last micro-step (no_sync): K x
    fewer bucket allreduces, and the ranks still agree;
  - ranks started with different flags refuse to train (exit 2, naming
    the ranks);
  - a rank that hangs (--fault hang) makes the others exit 75 within
    --collective-timeout with torchrun's error file naming the collective
    and the step; under cddprun --max_restarts=1 the group is restarted,
    resumes from the last checkpoint (every rank the same one) and
    finishes with the weights of an uninterrupted run, bit for bit;
  - a rank that crashes at step N, likewise: the restarted group resumes
    from the last checkpoint before N and ends bitwise where an
    uninterrupted run ends (deterministic CPU arithmetic, 1 thread per rank);
  - bootstrap failures: a wrong MASTER_PORT is a clear error within
    --init-timeout;
  - each step is reported on cddprun's progress channel (CDDP_PROGRESS_FD).
Small models and images (resnet18, 32x32 synthetic data) keep each test to
seconds, also under ASan.
"""
import glob
import json
import os
import re
import subprocess
import time

import pytest

from conftest import binary, free_port, run, wait_for

EXIT_TIMEOUT = 75
SMALL = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
         "10", "--epochs", "1", "--log-every", "1"]


def cddprun(tmp_path, nproc, args, timeout=180, extra=(), env=None):
    env = dict(os.environ if env is None else env)
    env.setdefault("LOGLEVEL", "INFO")
    return run([binary("cddprun"), f"--nproc_per_node={nproc}", "--standalone",
                f"--log_dir={tmp_path / 'logs'}", *extra, binary("cddp-train"), *args],
               timeout=timeout, env=env)


def by_rank(pattern, text):
    """{rank: [the pattern's last group, for each line]} from log lines
    'cddp-train[pid] rankN time LEVEL <pattern>'."""
    out = {}
    for m in re.finditer(r"cddp-train\[\d+\] rank(\d+) \S+ \w+ " + pattern, text):
        out.setdefault(int(m.group(1)), []).append(m.group(m.lastindex))
    return out


def checksums(text):
    return {r: v[-1] for r, v in by_rank(r"T6202: after \d+ steps: state checksum (\w+)",
                                         text).items()}


def test_four_ranks_end_with_identical_weights(tmp_path):
    r = cddprun(tmp_path, 4, SMALL + ["--num-samples", "64", "--batch-size", "4", "--steps",
                                      "3"], env=dict(os.environ, LOGLEVEL="DEBUG"))
    assert r.returncode == 0, r.stderr[-3000:]
    sums = checksums(r.stderr)
    assert sorted(sums) == [0, 1, 2, 3], r.stderr[-3000:]
    assert len(set(sums.values())) == 1, sums
    # they saw different samples: each rank's losses are its own
    losses = by_rank(r"T0002: step \d+ loss (\S+)", r.stderr)
    assert sorted(losses) == [0, 1, 2, 3]
    assert len({tuple(v) for v in losses.values()}) == 4, losses
    # and DDP said what it did: 3 steps, every bucket every step
    ddp = by_rank(r"T6203: (DDP: .*)", r.stderr)
    assert all("DDP: 3 steps" in v[0] for v in ddp.values()), ddp
    assert "Epoch 0 [0/4] Loss:" in r.stdout


def test_overlap_changes_nothing(tmp_path):
    files = {}
    for mode in ("overlap", "no-overlap"):
        out = tmp_path / f"{mode}.safetensors"
        extra = ["--no-overlap"] if mode == "no-overlap" else []
        r = cddprun(tmp_path, 2, SMALL + ["--num-samples", "32", "--batch-size", "4", "--steps",
                                          "2", "--bucket-cap-mb", "1", "--save", str(out)] + extra)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "overlap " + ("on" if mode == "overlap" else "off") in r.stderr
        files[mode] = out.read_bytes()
    assert files["overlap"] == files["no-overlap"]


def test_accumulation_reduces_on_the_last_micro_step_only(tmp_path):
    r = cddprun(tmp_path, 2, SMALL + ["--num-samples", "48", "--batch-size", "4",
                                      "--accum-steps", "2", "--steps", "3"])
    assert r.returncode == 0, r.stderr[-3000:]
    buckets = int(re.search(r"T6201: DDP over 2 ranks \(gloo\): (\d+) bucket", r.stderr).group(1))
    stats = by_rank(r"T6203: (DDP: .*)", r.stderr)
    for line in (v[0] for v in stats.values()):
        m = re.search(r"DDP: (\d+) steps, (\d+) bucket allreduces", line)
        assert m and int(m.group(1)) == 3 and int(m.group(2)) == 3 * buckets, line
    assert len(set(checksums(r.stderr).values())) == 1
    # 6 micro-batches of 4 per rank were seen: batches 0..5 of 6
    assert "Epoch 0 [5/6] Loss:" in r.stdout


def rank_env(rank, world, port, tmp_path, **extra):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TORCHELASTIC_ERROR_FILE=str(tmp_path / f"error-{rank}.json"), OMP_NUM_THREADS="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def test_ranks_with_different_flags_refuse(background, tmp_path):
    port = free_port()
    procs = [background([binary("cddp-train"), *SMALL, "--num-samples", "16", "--batch-size",
                         str(b), "--steps", "1"], env=rank_env(r, 2, port, tmp_path))
             for r, b in ((0, 4), (1, 8))]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [2, 2], [p.err for p in procs]
    assert "rank(s) 1 started with settings that differ from rank 0's" in procs[0].err
    assert "--batch-size 8" in procs[1].err


def test_hang_makes_the_others_exit_75_with_the_error_file(background, tmp_path):
    port = free_port()
    timeout = 5
    args = [binary("cddp-train"), *SMALL, "--num-samples", "48", "--batch-size", "4",
            "--collective-timeout", str(timeout), "--fault", "hang@step=1,rank=2"]
    t0 = time.monotonic()
    procs = {r: background(args, env=rank_env(r, 3, port, tmp_path)) for r in range(3)}
    codes = {r: procs[r].wait(timeout=120) for r in (0, 1)}
    took = time.monotonic() - t0
    assert codes == {0: EXIT_TIMEOUT, 1: EXIT_TIMEOUT}, {r: procs[r].err for r in (0, 1)}
    assert procs[2].proc.poll() is None, "the hanging rank should still be blocked"
    for r in (0, 1):
        data = json.loads((tmp_path / f"error-{r}.json").read_text())
        msg = data["message"]["message"]
        assert msg.startswith("CollectiveTimeoutError: "), msg
        assert "at step 1" in msg and f"on rank {r}" in msg, msg
        assert re.search(r"waited \d+\.\d s", msg) and f"--collective-timeout {timeout} s" in msg
        assert "T6010" in procs[r].err
    # the whole thing took the timeout plus start-up and one step, not much more
    assert took < 90, took
    procs[2].kill()
    assert "fault injection: hang at step 1 on rank 2" in procs[2].err


def test_wrong_master_port_is_a_clear_error(background, tmp_path):
    port, wrong = free_port(), free_port()
    args = [binary("cddp-train"), *SMALL, "--num-samples", "16", "--init-timeout", "2"]
    p1 = background(args, env=rank_env(1, 2, wrong, tmp_path))
    t0 = time.monotonic()
    assert p1.wait(timeout=60) == 1
    assert time.monotonic() - t0 < 2 + 10
    assert f"cannot reach the bootstrap store at 127.0.0.1:{wrong} within" in p1.err, p1.err
    assert "MASTER_ADDR and MASTER_PORT" in p1.err
    assert port != wrong


# Restarts under cddprun: 2 ranks, 2 epochs of 4 steps (shuffled), a
# checkpoint every 2 steps; the uninterrupted run is the reference.
RESTART = SMALL[:-4] + ["--epochs", "2", "--log-every", "1", "--num-samples", "32",
                        "--batch-size", "4", "--ckpt-every", "2"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    out = tmp / "final.safetensors"
    r = cddprun(tmp, 2, RESTART + ["--checkpoint", str(tmp / "ck.safetensors"), "--save",
                                   str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Epoch 1 finished" in r.stdout
    return out.read_bytes()


def attempt_files(tmp_path, attempt, name):
    return sorted(glob.glob(str(tmp_path / "logs" / "*" / f"attempt_{attempt}" / "*" / name)))


def test_crash_then_restart_resumes_bitwise(tmp_path, uninterrupted):
    out = tmp_path / "final.safetensors"
    r = cddprun(tmp_path, 2, RESTART + ["--checkpoint", str(tmp_path / "ck.safetensors"),
                                        "--save", str(out), "--fault", "crash@step=5,rank=1"],
                extra=["--max_restarts=1"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fault injection: crash at step 5 on rank 1" in r.stderr
    # the second attempt started from the checkpoint of step 4 (the last one
    # written), inside epoch 1, and ran to the end
    assert "=> resumed from checkpoint" in r.stdout and "step 4)" in r.stdout, r.stdout
    assert "Epoch 1 finished" in r.stdout
    assert out.read_bytes() == uninterrupted


def test_hang_then_restart_resumes_and_completes(tmp_path, uninterrupted):
    out = tmp_path / "final.safetensors"
    t0 = time.monotonic()
    r = cddprun(tmp_path, 2, RESTART + ["--checkpoint", str(tmp_path / "ck.safetensors"),
                                        "--save", str(out), "--collective-timeout", "5",
                                        "--fault", "hang@step=3,rank=1"],
                extra=["--max_restarts=1"])
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    # attempt 0: rank 0 timed out in step 3's first collective and wrote its error file
    files = attempt_files(tmp_path, 0, "error.json")
    assert files, list((tmp_path / "logs").rglob("*"))
    msg = json.loads(open(files[0]).read())["message"]["message"]
    assert msg.startswith("CollectiveTimeoutError: ") and "at step 3 on rank 0" in msg, msg
    assert "failed (exitcode: 75) local_rank: 0" in r.stderr, r.stderr[-3000:]
    # attempt 1 resumed from step 2's checkpoint and finished
    assert "=> resumed from checkpoint" in r.stdout and "step 2)" in r.stdout, r.stdout
    assert out.read_bytes() == uninterrupted
    assert took < 150, took


def test_progress_lines_on_the_progress_channel(tmp_path):
    r_fd, w_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["CDDP_PROGRESS_FD"] = str(w_fd)
    p = subprocess.Popen([binary("cddp-train"), *SMALL, "--num-samples", "12", "--batch-size",
                          "4", "--threads", "1"], env=env, pass_fds=(w_fd,),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    os.close(w_fd)
    with os.fdopen(r_fd) as fh:
        lines = fh.read().splitlines()
    assert p.wait(timeout=120) == 0, p.stderr.read()
    reports = [json.loads(l) for l in lines]
    assert [x["step"] for x in reports] == [1, 2, 3], lines
    assert all(x["epoch"] == 0 and x["loss"] > 0 and x["samples_per_s"] > 0 for x in reports)


@pytest.mark.heavy
def test_collective_timeout_is_its_own_exit_reason(background, tmp_path):
    """A hung rank: rank 0's collective times out (exit 75, error file) and
    the agent counts it as a collective timeout, not a crash, in /status and
    /metrics; the group restarts and the run succeeds."""
    import promparse
    from test_prometheus import metrics, status
    sport = free_port()
    log = tmp_path / "agent.log"
    with open(log, "w") as fh:
        agent = background([binary("cddprun"), "--nproc_per_node=2", "--standalone",
                            f"--log_dir={tmp_path / 'logs'}", "--max_restarts=1",
                            f"--status_port={sport}", "--status_linger=60",
                            binary("cddp-train"), *RESTART, "--checkpoint",
                            str(tmp_path / "ck.safetensors"), "--collective-timeout", "3",
                            "--fault", "hang@step=3,rank=1"],
                           env=dict(os.environ, LOGLEVEL="INFO"), stdout=subprocess.DEVNULL,
                           stderr=fh)

    def finished():
        st = status(sport)
        return st if st and st["state"] == "succeeded" else None
    try:
        st = wait_for(finished, timeout=150, what="the run to succeed after its restart")
    except BaseException:
        print(log.read_text(errors="replace")[-3000:])
        raise
    ex = st["worker_exits"]
    assert ex["collective_timeout"] == 1 and ex["failure"] == 0, ex
    assert st["restarts"]["by_reason"]["worker_failure"] == 1, st["restarts"]
    m = metrics(sport)
    assert promparse.value(m, "cddp_agent_worker_exits_total", reason="collective_timeout") == 1
    assert promparse.value(m, "cddp_agent_worker_exits_total", reason="failure") == 0
    text = log.read_text(errors="replace")
    assert "failed (exitcode: 75) local_rank: 0" in text, text[-3000:]
    assert re.search(r"T6010: \w+ at step 3 on rank 0 timed out", text), text[-3000:]
    msg = json.loads(open(attempt_files(tmp_path, 0, "error.json")[0]).read())["message"]
    assert msg["message"].startswith("CollectiveTimeoutError: "), msg
    agent.signal(15)  # ends the linger
    assert agent.wait(30) == 0


def test_sigterm_saves_the_step_then_resume_matches(background, tmp_path, uninterrupted):
    """cddprun stopped with SIGTERM (a preemption) during step 4: every rank
    finishes that step, rank 0 writes the checkpoint at step 5 (the last
    --ckpt-every one was step 4) and the workers die by SIGTERM. A new run
    resumes from step 5 and ends bit for bit where an uninterrupted run
    does."""
    ck, out = tmp_path / "ck.safetensors", tmp_path / "final.safetensors"
    args = RESTART + ["--checkpoint", str(ck), "--save", str(out)]
    log = tmp_path / "agent.log"
    env = dict(os.environ, LOGLEVEL="INFO", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="20")
    with open(log, "w") as fh:
        agent = background([binary("cddprun"), "--nproc_per_node=2", "--standalone",
                            f"--log_dir={tmp_path / 'logs'}", binary("cddp-train"), *args,
                            "--fault", "slow@step=4,ms=1500"],
                           env=env, stdout=subprocess.DEVNULL, stderr=fh)
    text = lambda: log.read_text(errors="replace")  # noqa: E731
    wait_for(lambda: len(re.findall(r"T6103: fault injection: sleeping", text())) == 2,
             timeout=120, what="both ranks in step 4's sleep")
    agent.signal(15)
    assert agent.wait(60) != 0
    t = text()
    assert re.search(r"rank0 \S+ WARNING T2011: Terminated: checkpoint at step 5 written", t), t[-3000:]
    assert re.search(r"rank1 \S+ INFO T2012: Terminated: stopping after step 5", t), t[-3000:]
    assert not out.exists()
    r = cddprun(tmp_path, 2, args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "=> resumed from checkpoint" in r.stdout and "step 5)" in r.stdout, r.stdout
    assert out.read_bytes() == uninterrupted
