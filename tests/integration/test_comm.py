"""trainer/comm/ over real processes: cddp-collbench ranks started with
torchrun's environment, the bootstrap store on a loopback port, real gloo.

What they assert: every collective's results on 1-4 ranks; a rank that never
calls makes the others exit 75 within the collective timeout with torchrun's
error file naming the collective, the step and the seconds waited; a peer
that dies makes them exit 75 at once; bootstrap failures (nobody at
MASTER_PORT, rank 0 never starts, a port held by something else, a bad
environment) end in one clear line within --init-timeout, never a hang.
"""
import json
import os
import socket
import time

import pytest

from conftest import binary, free_port, run

EXIT_TIMEOUT = 75


def rank_env(rank, world, port, tmp_path=None, **extra):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if tmp_path is not None:
        env["TORCHELASTIC_ERROR_FILE"] = str(tmp_path / f"error-{rank}.json")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(background, world, args=(), ranks=None, port=None, tmp_path=None, **extra):
    port = port or free_port()
    ranks = range(world) if ranks is None else ranks
    return {r: background([binary("cddp-collbench"), *args],
                          env=rank_env(r, world, port, tmp_path, **extra)) for r in ranks}


def wait_all(procs, timeout):
    deadline = time.monotonic() + timeout
    return {r: p.wait(timeout=max(1, deadline - time.monotonic())) for r, p in procs.items()}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_correct(background, world):
    procs = start(background, world, ["--check"])
    codes = wait_all(procs, 120)
    errs = {r: p.err for r, p in procs.items()}
    assert codes == {r: 0 for r in range(world)}, errs
    assert f"world {world}, gloo:" in procs[0].out
    assert "all results right" in procs[0].out, procs[0].out


def test_world_size_one_without_environment():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    r = run([binary("cddp-collbench"), "--check"], env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "world 1, local:" in r.stdout and "all results right" in r.stdout


def read_error_file(path):
    data = json.loads(path.read_text())
    msg = data["message"]
    assert set(msg) == {"message", "extraInfo"}
    int(msg["extraInfo"]["timestamp"])  # torchrun parses it as an int
    return msg["message"], msg["extraInfo"]["py_callstack"]


def test_rank_that_never_calls_times_out_others_with_exit_75(background, tmp_path):
    # Rank 2 hangs before step 1's first collective; 0 and 1 wait 2 s in it.
    timeout = 2
    t0 = time.monotonic()
    procs = start(background, 3, ["--check", f"--collective-timeout={timeout}",
                                  "--fault=hang@step=1,rank=2"], tmp_path=tmp_path)
    codes = {r: procs[r].wait(timeout=60) for r in (0, 1)}
    took = time.monotonic() - t0
    assert codes == {0: EXIT_TIMEOUT, 1: EXIT_TIMEOUT}, {r: procs[r].err for r in (0, 1)}
    assert took < timeout + 15, f"exit took {took:.1f}s with --collective-timeout {timeout}"
    assert procs[2].proc.poll() is None, "the hanging rank should still be blocked"
    procs[2].kill()
    assert "fault injection: hang at step 1 on rank 2" in procs[2].err
    for r in (0, 1):
        message, stack = read_error_file(tmp_path / f"error-{r}.json")
        assert message.startswith("CollectiveTimeoutError: ")
        assert f"at step 1 on rank {r} timed out" in message
        assert "--collective-timeout 2 s" in message
        waited = float(message.split("waited ")[1].split(" s")[0])
        assert timeout - 0.5 <= waited < timeout + 10
        assert f"rank {r}" in stack
        # printed too (stderr), with its message id
        assert "T6010" in procs[r].err and "timed out" in procs[r].err
    assert not (tmp_path / "error-2.json").exists()


def test_peer_crash_fails_others_fast_with_exit_75(background, tmp_path):
    # A long timeout: the survivors must notice the dead peer, not wait it out.
    procs = start(background, 3, ["--check", "--collective-timeout=120",
                                  "--fault=crash@step=2,rank=1"], tmp_path=tmp_path)
    t0 = time.monotonic()
    codes = wait_all(procs, 60)
    took = time.monotonic() - t0
    assert codes[1] == 1
    assert codes[0] == EXIT_TIMEOUT and codes[2] == EXIT_TIMEOUT, {r: p.err for r, p in procs.items()}
    assert took < 30, f"survivors took {took:.1f}s to notice the crash"
    message, _ = read_error_file(tmp_path / "error-0.json")
    assert message.startswith("CollectiveError: ")
    assert "at step 2 on rank 0 failed" in message and "a peer failed" in message
    assert not (tmp_path / "error-1.json").exists()


def test_peer_crash_mid_transfer_no_sigpipe(background, tmp_path):
    # Rank 1 dies while the others push 64 MiB at it: their writes hit a
    # reset socket. That must be EPIPE and exit 75, never death by SIGPIPE.
    mib64 = str(64 << 20)
    procs = start(background, 3, ["--bench", "--min-bytes", mib64, "--max-bytes", mib64,
                                  "--fault=crash@step=0,rank=1"], tmp_path=tmp_path)
    codes = wait_all(procs, 60)
    assert codes == {0: EXIT_TIMEOUT, 1: 1, 2: EXIT_TIMEOUT}, {r: p.err for r, p in procs.items()}
    for r in (0, 2):
        message, _ = read_error_file(tmp_path / f"error-{r}.json")
        assert "a peer failed" in message


def test_fault_not_repeated_after_restart_unless_every():
    base = [binary("cddp-collbench"), "--check"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = run(base + ["--fault=crash@step=2"], env=env, timeout=60)
    assert r.returncode == 1 and "crash at step 2" in r.stderr
    r = run(base + ["--fault=crash@step=2"], env=dict(env, TORCHELASTIC_RESTART_COUNT="1"),
            timeout=60)
    assert r.returncode == 0, r.stderr
    r = run(base + ["--fault=crash@step=2,every"], env=dict(env, TORCHELASTIC_RESTART_COUNT="1"),
            timeout=60)
    assert r.returncode == 1 and "crash at step 2" in r.stderr


def test_bad_fault_flag_is_usage_error():
    r = run([binary("cddp-collbench"), "--fault=explode@step=1"], timeout=30)
    assert r.returncode == 2
    assert "unknown fault kind 'explode'" in r.stderr


def test_wrong_master_port_clear_error_within_init_timeout(background):
    port, wrong = free_port(), free_port()
    p0 = start(background, 2, ["--check", "--init-timeout=3"], ranks=[0], port=port)[0]
    p1 = start(background, 2, ["--check", "--init-timeout=3"], ranks=[1], port=wrong)[1]
    t0 = time.monotonic()
    assert p1.wait(timeout=30) == 1
    assert time.monotonic() - t0 < 3 + 5
    assert f"cannot reach the bootstrap store at 127.0.0.1:{wrong} within" in p1.err
    assert "MASTER_ADDR and MASTER_PORT" in p1.err
    # rank 0 gave up waiting for rank 1 within its own --init-timeout, and says so
    assert p0.wait(timeout=30) == 1
    assert "bootstrap" in p0.err and "not set within" in p0.err, p0.err


def test_rank_0_never_starts(background):
    procs = start(background, 3, ["--check", "--init-timeout=2"], ranks=[1, 2])
    t0 = time.monotonic()
    codes = wait_all(procs, 30)
    assert codes == {1: 1, 2: 1}
    assert time.monotonic() - t0 < 2 + 5
    for p in procs.values():
        assert "cannot reach the bootstrap store at 127.0.0.1:" in p.err
        assert p.err.count("\n") <= 2, p.err


def test_unresolvable_master_addr(background):
    procs = start(background, 2, ["--check", "--init-timeout=1"], ranks=[1],
                  MASTER_ADDR="no-such-host.invalid")
    assert procs[1].wait(timeout=30) == 1
    assert "cannot resolve 'no-such-host.invalid'" in procs[1].err


def test_port_held_by_something_else(background):
    # A listener that accepts and never answers: rank 1 must not take it for a
    # store, and rank 0 cannot serve there; both say so within --init-timeout.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        port = s.getsockname()[1]
        procs = start(background, 2, ["--check", "--init-timeout=2"], port=port)
        codes = wait_all(procs, 30)
    assert codes == {0: 1, 1: 1}
    assert "cannot serve the bootstrap store on 127.0.0.1:" in procs[0].err
    assert "address already in use" in procs[0].err.lower()
    assert "is not a cddp bootstrap store, or it did not answer" in procs[1].err


def test_duplicate_rank_is_named(background):
    port = free_port()
    procs = {}
    for i, r in enumerate([0, 1, 1]):
        procs[i] = background([binary("cddp-collbench"), "--check", "--init-timeout=3"],
                              env=rank_env(r, 3, port))
        if i == 1:
            time.sleep(0.3)  # the second RANK=1 arrives second
    codes = wait_all(procs, 30)
    assert codes[2] == 1, procs[2].err
    assert "RANK=1 is claimed by 2 workers" in procs[2].err
    assert codes[0] != 0 and codes[1] != 0


def test_no_agent_store_is_a_clear_error():
    """TORCHELASTIC_USE_AGENT_STORE=True and nothing on MASTER_PORT: one line
    naming the launcher's store, within --init-timeout (not a usage error)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env = dict(base, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1",
               TORCHELASTIC_USE_AGENT_STORE="True")
    r = run([binary("cddp-collbench"), "--init-timeout=2"], env=env, timeout=30)
    assert r.returncode not in (0, 2), r.stderr
    assert "TORCHELASTIC_USE_AGENT_STORE=True, but the launcher's TCPStore" in r.stderr, r.stderr


@pytest.mark.parametrize("env,needle", [
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 is not below WORLD_SIZE=2"),
])
def test_bad_environment_is_usage_error(env, needle):
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    r = run([binary("cddp-collbench")], env=dict(base, **env), timeout=30)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
