"""Warm spares: cddprun --restart_scope=worker --spare_workers=N
(docs/distributed.md, "Warm spares").

Real processes. The agent keeps N spare processes of the entrypoint, started
with CDDP_SPARE=1 and CDDP_SPARE_FD; when a worker fails, a spare is handed
its place (the worker's whole environment and its fds over the socket) and
becomes that rank's process, and a new spare is started once the group has
re-formed:
  - a plain Python program speaking the protocol by hand (socket.recv_fds):
    the spare becomes rank 1 with the failed worker's environment, its
    stdout and its progress channel; the survivors keep their pids; /status
    counts the spare apart from the world; a new spare is started; no spare
    is left after the run;
  - cddp-train: a spare takes a crashed rank's place and the run ends on the
    no-fault run's state checksum (T6202) (heavy: two 4-rank runs);
  - a program that does not speak it: its spares die, are started again
    (A0243), then no more (A0244), and the job still succeeds;
  - --spare_workers without --restart_scope=worker is one line and exit 2.
"""
import json
import os
import re

import pytest

from conftest import binary, free_port, run
from test_inplace import (TINY, checksums, env, pids_by_rank, reference,  # noqa: F401
                          succeeded, wait_status)

PY = "/usr/bin/python3"

# A worker that speaks the spare protocol. D: a folder for its marks.
# Rank 1 of generation 0 fails once a spare is waiting; the spare takes its
# place, reports a step (so the agent knows the group re-formed) and waits
# for the test's "finish"; the survivors wait for the replacement's "go".
PROTO = r"""
import json, os, socket, sys, time
D = os.environ["D"]
def mark(name, text=""):
    with open(os.path.join(D, name), "w") as f:
        f.write(text)
def wait(name):
    end = time.monotonic() + 60
    while not os.path.exists(os.path.join(D, name)):
        if time.monotonic() > end:
            sys.exit(9)
        time.sleep(0.02)
if os.environ.get("CDDP_SPARE") == "1":
    assert "RANK" not in os.environ and "LOCAL_RANK" not in os.environ
    sock = socket.socket(fileno=int(os.environ["CDDP_SPARE_FD"]))
    mark("spare-%d" % os.getpid())
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 18, 16)
    if not msg:
        sys.exit(0)
    env = dict(e.decode().split("=", 1) for e in msg.split(b"\0") if e)
    where = [int(w) for w in env.pop("CDDP_SPARE_FDS").split(",") if w]
    assert len(where) == len(fds), (where, fds)
    for fd, w in zip(fds, where):
        os.dup2(fd, w)
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
r = int(os.environ["RANK"]); g = int(os.environ["CDDP_GENERATION"])
os.write(1, ("START %d %d %d %s\n" % (r, g, os.getpid(),
                                      os.environ["TORCHELASTIC_RESTART_COUNT"])).encode())
if r == 1 and g == 0:
    while not any(n.startswith("spare-") for n in os.listdir(D)):
        time.sleep(0.02)
    sys.exit(3)
if g == 0:
    wait("go")
else:
    os.write(int(os.environ["CDDP_PROGRESS_FD"]), json.dumps({"step": 1}).encode() + b"\n")
    wait("finish")
    mark("go")
os.write(1, ("END %d %d\n" % (r, os.getpid())).encode())
"""


def spare_pids(d):
    return {int(n.split("-")[1]) for n in os.listdir(d) if n.startswith("spare-")}


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_spare_takes_the_failed_rank(tmp_path, background):
    script = tmp_path / "proto.py"
    script.write_text(PROTO)
    d = tmp_path / "marks"
    d.mkdir()
    sport = free_port()
    agent = background([binary("cddprun"), "--nproc_per_node=3", f"--master_port={free_port()}",
                        "--max_restarts=1", "--restart_scope=worker", "--spare_workers=1",
                        f"--status_port={sport}", "--no_python", PY, script],
                       env=env(D=str(d)))
    # the replacement reported its step: the agent started a new spare
    st = wait_status(sport, lambda s: s["restarts"].get("generation") == 1 and
                     s["restarts"].get("spares") == 1 and len(spare_pids(d)) == 2)
    assert len(st["workers"]) == 3 and st["world_size"] == 3, json.dumps(st)[:3000]
    assert [w["restarts"] for w in st["workers"]] == [0, 1, 0]
    first, second = sorted(spare_pids(d), key=lambda p: os.stat(d / f"spare-{p}").st_mtime_ns)
    assert st["workers"][1]["pid"] == first
    assert alive(second)
    (d / "finish").write_text("")
    assert agent.wait(60) == 0, agent.err[-3000:]
    out = agent.out
    starts = re.findall(r"START (\d) (\d) (\d+) (\d+)", out)
    assert sorted((r, g, c) for r, g, _, c in starts) == [
        ("0", "0", "0"), ("1", "0", "0"), ("1", "1", "1"), ("2", "0", "0")], out
    pids = {r: int(p) for r, g, p, _ in starts if not (r == "1" and g == "0")}
    assert pids["1"] == first  # the spare became rank 1
    assert {r: int(p) for r, p in re.findall(r"END (\d) (\d+)", out)} == pids
    err = agent.err
    assert err.count("A0240") == 2 and err.count("A0246") == 1, err[-3000:]
    assert "A0243" not in err and "A0244" not in err
    # no spare outlives the run
    assert not alive(first) and not alive(second)


@pytest.mark.heavy
def test_cddp_train_spare_recovers_bit_for_bit(background, reference):  # noqa: F811
    sport = free_port()
    agent = background([binary("cddprun"), "--nproc_per_node=4", f"--master_port={free_port()}",
                        "--max_restarts=1", "--restart_scope=worker", "--spare_workers=1",
                        f"--status_port={sport}", "--status_linger=60", binary("cddp-train"),
                        *TINY, "--fault", "crash@step=2,rank=2"], env=env())
    st, err = succeeded(agent, sport)
    assert st["restarts"]["by_scope"] == {"worker": 1, "group": 0}
    spares = [int(p) for p in re.findall(r"A0240: .*started spare worker \d \(pid (\d+)\)", err)]
    taken = re.findall(r"A0246: .*spare worker pid (\d+) takes the place of local_rank 2", err)
    assert len(spares) == 2 and taken == [str(spares[0])], err[-5000:]
    assert err.count("T6202") == 4 and checksums(err) == reference, err[-5000:]
    before, after = pids_by_rank(err, "T6201"), pids_by_rank(err, "T6202")
    assert after[2] == spares[0] and before[2] != spares[0]
    assert all(before[r] == after[r] for r in (0, 1, 3)), (before, after)
    assert not alive(spares[0]) and not alive(spares[1])


# An entrypoint that knows nothing of spares: without RANK it fails at once.
PLAIN = r"""
import os, sys, time
r = int(os.environ["RANK"])
time.sleep(4)
"""


def test_spares_of_a_program_that_does_not_speak_it(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    r = run([binary("cddprun"), "--nproc_per_node=2", f"--master_port={free_port()}",
             "--restart_scope=worker", "--spare_workers=1", "--no_python", PY, script],
            env=env(), timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("A0243") == 2 and r.stderr.count("A0244") == 1, r.stderr[-3000:]


def test_spare_workers_needs_worker_scope():
    r = run([binary("cddprun"), "--spare_workers=1", "true"])
    assert r.returncode == 2
    assert "--spare_workers=1 needs --restart_scope=worker" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run([binary("cddprun"), "--restart_scope=worker", "--spare_workers=65", "true"])
    assert r.returncode == 2 and "--spare_workers" in r.stderr, r.stderr
