"""Recovering in place: cddprun --restart_scope=worker (docs/distributed.md,
"Recovering in place").

Real processes and sockets. The agent restarts only the failed worker (same
RANK and LOCAL_RANK), announces the new generation on its store
(cddp/gen/N/replaced, then cddp/gen), and the others keep their processes:
  - a plain program (torch's TCPStore as the store client) sees the keys
    and keeps its pid; /status shows restarts 0 for the survivors, 1 for
    the replaced worker, restarts by scope and the generation;
  - cddp-train (4 ranks, CPU gloo) re-forms its group in place after
    --fault crash@step=N,rank=R and, without --checkpoint, ends on the same
    state checksum (T6202) as a run with no fault;
  - a hung rank (--fault hang@step=N,rank=R): the others' collectives time
    out (--collective-timeout), name it to the agent, which kills it and
    replaces it in place; same checksum, the others keep their pids;
  - the replacement dies while taking the state (--fault crash@reform): the
    others exit 75 and the agent restarts the group, which resumes from
    --checkpoint and ends on the same checksum;
  - the failure table names the workers replaced in place (scope, rank,
    generation), also when the run succeeds;
  - two nodes (two agents on loopback): a crashed worker on node 1 restarts
    alone, the generation granted by the rendezvous (`replace`) and
    announced by node 0; a hung rank alone on its node is named by the other
    node's ranks and passed on to its agent (`blame`); both end on the
    no-fault checksum with the others' processes kept;
  - the same over the etcd-v3 rendezvous (a real etcd member): the grant
    through the run's state key, the blame through news/blame/; two
    failures at once on two nodes: one restarted alone, then the group;
  - an unmodified PyTorch script, whose ranks die when one dies, falls back
    to a whole-group restart and still finishes;
  - a bad value is one line and exit 2.
"""
import json
import os
import re
import signal
import time

import pytest

from conftest import TORCH_PY, agent_status as status, binary, free_port, run
from test_etcd import ETCD, etcd  # noqa: F401 (the fixture)

TINY = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
        "10", "--epochs", "4", "--log-every", "1", "--num-samples", "32", "--batch-size", "4"]


def wait_status(port, pred, timeout=60):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = status(port)
        if last is not None and pred(last):
            return last
        time.sleep(0.1)
    pytest.fail(f"/status never matched: {json.dumps(last)[:3000]}")


def succeeded(agent, sport):
    """Waits for the run's end on /status, ends the agent's linger (its exit
    status stays the run's: 0), and returns the last /status and stderr;
    the run must have succeeded."""
    st = wait_status(sport, lambda s: s["state"] in ("succeeded", "failed", "terminated"),
                     timeout=300)
    agent.signal(signal.SIGTERM)
    assert agent.wait(60) == 0, agent.err[-5000:]
    assert st["state"] == "succeeded", json.dumps(st)[:3000]
    return st, agent.err


def env(**kw):
    e = dict(os.environ, PYTHON_EXEC=TORCH_PY, LOGLEVEL="INFO")
    e.update(kw)
    return e


# Rank 1 fails in generation 0. The others wait for the generation on the
# agent's store (bare keys, as any script may read them) and then for the
# replacement; the replacement waits for the test's go.
PLAIN = r"""
import datetime, os, sys, time
import torch.distributed as dist
r = int(os.environ["RANK"]); g = int(os.environ["CDDP_GENERATION"])
os.write(1, ("START %d %d %d %s %s\n" % (r, g, os.getpid(), os.environ["CDDP_RESTART_SCOPE"],
             os.environ["TORCHELASTIC_RESTART_COUNT"])).encode())
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                  timeout=datetime.timedelta(seconds=30))
if r == 1 and g == 0:
    sys.exit(3)
if g == 0:
    s.wait(["cddp/gen/1/replaced"])
    os.write(1, ("SAW %d %s %s\n" % (r, s.get("cddp/gen/1/replaced").decode(),
                                     s.get("cddp/gen").decode())).encode())
    s.wait(["done"])
else:
    while not os.path.exists(os.environ["GO"]):
        time.sleep(0.05)
    s.set("done", b"1")
os.write(1, ("END %d %d\n" % (r, os.getpid())).encode())
"""


def test_plain_program_only_the_failed_worker_restarts(tmp_path, background, torch_python):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    go = tmp_path / "go"
    sport = free_port()
    agent = background([binary("cddprun"), "--nproc_per_node=3", f"--master_port={free_port()}",
                        "--max_restarts=1", "--restart_scope=worker", f"--status_port={sport}",
                        script], env=env(GO=str(go)))
    st = wait_status(sport, lambda s: s["restarts"].get("generation") == 1 and all(
        w.get("pid") for w in s["workers"]))
    assert st["restarts"]["scope"] == "worker"
    assert st["restarts"]["by_scope"] == {"worker": 1, "group": 0}
    assert st["restarts"]["count"] == 1
    assert [w["restarts"] for w in st["workers"]] == [0, 1, 0]
    go.write_text("")
    assert agent.wait(60) == 0, agent.err[-3000:]
    out = agent.out
    starts = re.findall(r"START (\d) (\d) (\d+) (\w+) (\d+)", out)
    assert sorted((r, g, scope, count) for r, g, _, scope, count in starts) == [
        ("0", "0", "worker", "0"), ("1", "0", "worker", "0"), ("1", "1", "worker", "1"),
        ("2", "0", "worker", "0")], out
    # the survivors saw the generation and kept their processes
    assert sorted(re.findall(r"SAW (\d) (\S+) (\S+)", out)) == [("0", "1", "1"), ("2", "1", "1")]
    pids = {r: p for r, g, p, _, _ in starts if not (r == "1" and g == "0")}
    assert dict(re.findall(r"END (\d) (\d+)", out)) == pids
    assert agent.err.count("A0220") == 1 and "attempt 1, restart count" not in agent.err
    # the table at exit names the worker replaced in place
    err = agent.err
    assert "RECOVERED IN PLACE" in err and "FAILED" not in err, err[-3000:]
    assert re.search(r"rank      : 1 \(local_rank: 1\)\n  exitcode  : 3 \(pid: \d+\)", err), err
    assert "replaced in place (restart scope worker, rank 1, generation 1)" in err, err[-3000:]


def checksums(text):
    return set(re.findall(r"T6202: after \d+ steps: state checksum (\w+)", text))


def pids_by_rank(text, code):
    return {int(r): int(p) for p, r in re.findall(rf"cddp-train\[(\d+)\] rank(\d) \S+ \w+ {code}:",
                                                  text)}


@pytest.fixture(scope="module")
def reference():
    """The no-fault run's checksum (4 ranks, CPU gloo, 8 steps)."""
    ref = run([binary("cddprun"), "--nproc_per_node=4", f"--master_port={free_port()}",
               binary("cddp-train"), *TINY], env=env(), timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = checksums(ref.stderr)
    assert len(want) == 1 and ref.stderr.count("T6202: after 8 steps") == 4, ref.stderr[-3000:]
    return want


def survivors_kept(err, replaced):
    """The ranks not replaced are the processes that started; the others new."""
    before, after = pids_by_rank(err, "T6201"), pids_by_rank(err, "T6202")
    assert sorted(after) == [0, 1, 2, 3], err[-5000:]
    for r in range(4):
        assert (before.get(r) == after[r]) == (r not in replaced), (r, before, after)


@pytest.mark.heavy
def test_cddp_train_crash_recovers_in_place_bit_for_bit(background, reference):
    sport = free_port()
    agent = background([binary("cddprun"), "--nproc_per_node=4", f"--master_port={free_port()}",
                        "--max_restarts=1", "--restart_scope=worker", f"--status_port={sport}",
                        "--status_linger=60", binary("cddp-train"), *TINY,
                        "--fault", "crash@step=2,rank=2"], env=env())
    st, err = succeeded(agent, sport)
    assert [w["restarts"] for w in st["workers"]] == [0, 0, 1, 0]
    assert st["restarts"]["by_scope"] == {"worker": 1, "group": 0}
    assert st["restarts"]["generation"] == 1 and st["restarts"]["last_recovery_s"] > 0
    # one start of the group, one worker restarted alone, no checkpoint
    assert err.count("A0207") == 1 and err.count("A0220") == 1, err[-5000:]
    assert "fault injection: crash at step 2 on rank 2" in err
    # every rank re-formed generation 1 with rank 0's state, and redid step 2
    assert len(re.findall(r"T6212: generation 1: state from rank 0, checksum \w+; running step 2",
                          err)) == 4, err[-5000:]
    # the replacement read rank 0's parameters from its memory (trainer/cma.h)
    assert err.count("1 rank read them from a peer's memory on their host, 0 took them over "
                     "the network") == 4, err[-5000:]
    assert err.count("T6202") == 4 and checksums(err) == reference, err[-5000:]
    survivors_kept(err, {2})


@pytest.mark.heavy
def test_cddp_train_two_failures_in_a_row(background):
    """Rank 2 crashes at step 2 and is replaced alone; once the group has
    re-formed (the replacement's first step, past the settle window), rank 3
    is SIGKILLed wherever it is: generation 2. The run ends on the no-fault
    checksum, ranks 0 and 1 in their first processes. With
    CDDP_CMA_DISABLE=1: the parameters go over the network (gloo's point to
    point), not by reading a peer's memory. 24 steps, not TINY's 8: the
    second failure must come past the settle window and before the end."""
    longer = [*TINY, "--epochs", "12"]
    ref = run([binary("cddprun"), "--nproc_per_node=4", f"--master_port={free_port()}",
               binary("cddp-train"), *longer], env=env(), timeout=300)
    assert ref.returncode == 0 and ref.stderr.count("T6202: after 24 steps") == 4, \
        ref.stderr[-3000:]
    reference = checksums(ref.stderr)
    sport = free_port()
    agent = background([binary("cddprun"), "--nproc_per_node=4", f"--master_port={free_port()}",
                        "--max_restarts=2", "--restart_scope=worker", f"--status_port={sport}",
                        "--status_linger=60", binary("cddp-train"), *longer,
                        "--fault", "crash@step=2,rank=2"], env=env(CDDP_CMA_DISABLE="1"))
    # The group steady again: every rank past the redone step (step 3).
    st = wait_status(sport, lambda s: s["restarts"].get("last_recovery_s") is not None and all(
        ((w.get("progress") or {}).get("step") or 0) >= 4 for w in s["workers"]), timeout=120)
    assert st["restarts"]["generation"] == 1
    # Past the settle window too: a failure within 1 s of the replacement's
    # start falls back to a group restart (docs/distributed.md), and a
    # replacement now re-forms in less than that.
    time.sleep(max(0.0, 1.3 - st["restarts"]["last_recovery_s"]))
    st = status(sport)
    assert st["state"] == "running" and st["workers"][3]["progress"]["step"] < 20, st
    os.kill(st["workers"][3]["pid"], signal.SIGKILL)
    st, err = succeeded(agent, sport)
    assert [w["restarts"] for w in st["workers"]] == [0, 0, 1, 1]
    assert st["restarts"]["by_scope"] == {"worker": 2, "group": 0}
    assert st["restarts"]["generation"] == 2
    assert err.count("A0220") == 2 and err.count("A0207") == 1, err[-5000:]
    assert err.count("0 ranks read them from a peer's memory on their host, 1 took them over "
                     "the network") == 8, err[-5000:]
    assert err.count("T6202") == 4 and checksums(err) == reference, err[-5000:]
    survivors_kept(err, {2, 3})


def test_refused_read_of_a_peers_memory_falls_back_to_the_network(background):
    """Two ranks; rank 1 is SIGKILLed mid-run and replaced alone. Its
    replacement's read of rank 0's memory is refused (--fault
    nocma@rank=1: EPERM, as under a seccomp profile or Yama's
    ptrace_scope 3): it says so (T6224) and the parameters come over the
    network; both ranks then hold the same state (T6212's check) and train
    to the end. Not heavy: cddp-train's recovery in place under ASan."""
    sport = free_port()
    agent = background([binary("cddprun"), "--nproc_per_node=2", f"--master_port={free_port()}",
                        "--max_restarts=1", "--restart_scope=worker", f"--status_port={sport}",
                        "--status_linger=60", binary("cddp-train"), *TINY,
                        "--fault", "nocma@rank=1"], env=env())
    st = wait_status(sport, lambda s: len(s["workers"]) == 2 and all(
        ((w.get("progress") or {}).get("step") or 0) >= 2 for w in s["workers"]), timeout=120)
    first = [w["pid"] for w in st["workers"]]
    os.kill(first[1], signal.SIGKILL)
    st, err = succeeded(agent, sport)
    assert [w["restarts"] for w in st["workers"]] == [0, 1]
    before, after = pids_by_rank(err, "T6201"), pids_by_rank(err, "T6202")
    assert before == {0: first[0], 1: first[1]} and after[0] == first[0], err[-5000:]
    assert after[1] != first[1], err[-5000:]
    assert re.search(r"rank1 \S+ WARNING T6224: generation 1: reading rank 0's parameters from "
                     r"its memory on this host failed \(Operation not permitted\)", err), err[-5000:]
    # the source and the replacement both say how they went; nothing exited 75
    assert err.count("0 ranks read them from a peer's memory on their host, 1 took them over "
                     "the network") == 2, err[-5000:]
    assert "exit 75" not in err and err.count("A0207") == 1, err[-5000:]
    assert err.count("T6202") == 2 and len(checksums(err)) == 1, err[-5000:]


@pytest.mark.heavy
@pytest.mark.parametrize("hung", ["1", "2-3"])
def test_cddp_train_hang_recovers_in_place(background, reference, hung):
    """Rank 1 (or ranks 2 and 3, as a node's ranks hang together) hangs
    before step 2's first collective. The others' collectives time out
    after --collective-timeout 3 and name the hung ranks (their published
    collective numbers are behind) to the agent on the progress channel;
    the agent kills them and replaces them in one generation; the others
    re-form without exiting. Same checksum as without the hang."""
    ranks = [int(r) for r in hung.split("-")]
    replaced = set(range(ranks[0], ranks[-1] + 1))
    sport = free_port()
    agent = background([binary("cddprun"), "--nproc_per_node=4", f"--master_port={free_port()}",
                        "--max_restarts=1", "--restart_scope=worker", f"--status_port={sport}",
                        "--status_linger=60", binary("cddp-train"), *TINY,
                        "--collective-timeout", "3", "--fault", f"hang@step=2,rank={hung}"],
                       env=env())
    st, err = succeeded(agent, sport)
    assert [w["restarts"] for w in st["workers"]] == [int(r in replaced) for r in range(4)]
    # one restart of the budget (--max_restarts=1), however many it replaced
    assert st["restarts"]["by_scope"] == {"worker": 1, "group": 0}
    assert st["restarts"]["count"] == 1 and st["restarts"]["scope_fallbacks"] == 0
    assert st["restarts"]["generation"] == 1
    for r in replaced:
        assert f"fault injection: hang at step 2 on rank {r}" in err
        # a survivor named it; the agent killed it and restarted it
        assert re.search(rf"A0224: .*local_rank {r} \(rank {r}, pid \d+\) never reached", err), \
            err[-5000:]
    named = ", ".join(str(r) for r in sorted(replaced))
    assert re.search(rf"T6214: .*ranks? {named} never reached it", err), err[-5000:]
    # one generation replaced them all, announced once
    names = ",".join(str(r) for r in sorted(replaced))
    assert err.count("A0220") == len(replaced) and err.count("A0207") == 1, err[-5000:]
    assert err.count(f"generation 1 (replaces rank{'s' if len(replaced) > 1 else ''} {names})") \
        == len(replaced), err[-5000:]
    assert "T6105" not in err and "exit 75" not in err
    assert len(re.findall(r"T6212: generation 1: state from rank 0, checksum \w+; running step 2",
                          err)) == 4, err[-5000:]
    assert err.count("T6202") == 4 and checksums(err) == reference, err[-5000:]
    survivors_kept(err, replaced)
    # the table at exit: the replaced ranks, killed for the blame
    assert err.count("killed by the agent: rank") >= len(replaced), err[-3000:]
    # the figure (docs/benchmarks.md): from the collective's start to re-formed
    took = [float(x) for x in re.findall(r"T6211: rank \d re-formed generation 1 in [\d.]+ s "
                                         r"\(([\d.]+) s after the failed collective began\)",
                                         err)]
    assert len(took) == 4 - len(replaced), err[-5000:]
    print(f"hang of rank(s) {hung} to re-formed: {max(took):.3f} s (--collective-timeout 3)")


@pytest.mark.heavy
def test_cddp_train_replacement_dies_while_taking_the_state(background, tmp_path, reference):
    """Rank 2 is SIGKILLed after step 2's checkpoint; its replacement dies
    while it takes the state (--fault crash@reform,rank=2): the others'
    broadcast fails, they exit 75, and the agent restarts the group, which
    resumes from --checkpoint and ends on the no-fault checksum."""
    sport = free_port()
    ck = tmp_path / "ck.safetensors"
    agent = background([binary("cddprun"), "--nproc_per_node=4", f"--master_port={free_port()}",
                        "--max_restarts=2", "--restart_scope=worker", f"--status_port={sport}",
                        "--status_linger=60", binary("cddp-train"), *TINY,
                        "--checkpoint", str(ck), "--ckpt-every", "2",
                        "--fault", "crash@reform,rank=2"], env=env())
    st = wait_status(sport, lambda s: ck.exists() and all(
        (w.get("progress") or {}).get("step", 0) >= 2 for w in s["workers"]), timeout=120)
    os.kill(st["workers"][2]["pid"], signal.SIGKILL)
    st, err = succeeded(agent, sport)
    assert "T6105: fault injection: crash while taking the state in generation 1 on rank 2" in err
    assert err.count("A0220") == 1, err[-5000:]
    # the survivors' broadcast failed: exit 75; then the group restarted
    assert re.search(r"A0207: \[default\] starting 4 workers \(attempt 2, restart count 2/2\)",
                     err), err[-5000:]
    assert st["restarts"]["by_scope"] == {"worker": 1, "group": 1}, json.dumps(st)[:3000]
    assert "=> resumed from checkpoint" in agent.out, agent.out[-3000:]
    assert checksums(err) == reference, err[-5000:]
    # the table at exit names the first replacement's predecessor
    assert "replaced in place (restart scope worker, rank 2, generation 1)" in err, err[-3000:]


NO_ETCD = pytest.mark.skipif(not os.access(ETCD, os.X_OK),
                             reason="etcd is not installed (tools/setup.sh installs etcd-server)")
ETCD_FAST = "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1"


def two_agents(background, request, backend, run_id, nprocs, args, max_restarts=1):
    """Two agents on loopback (--nnodes=2, nprocs[i] workers on node i),
    --restart_scope=worker, each with a status port: over c10d with the
    rendezvous hosted in the first, or over etcd-v3 with a real etcd member
    (the etcd fixture). Returns the agents and their status ports."""
    sports = [free_port(), free_port()]
    if backend == "c10d":
        rport = free_port()
        rdzv = [[f"--rdzv_endpoint=127.0.0.1:{rport}", f"--rdzv_conf=is_host={1 - i}"]
                for i in range(2)]
    else:
        e = request.getfixturevalue("etcd")(1)
        rdzv = [[f"--rdzv_endpoint={e.endpoints}", ETCD_FAST]] * 2
    agents = []
    for i in range(2):
        agents.append(background(
            [binary("cddprun"), "--nnodes=2", f"--nproc_per_node={nprocs[i]}",
             f"--rdzv_backend={backend}", f"--rdzv_id={run_id}", *rdzv[i],
             f"--max_restarts={max_restarts}",
             "--restart_scope=worker", f"--status_port={sports[i]}", "--status_linger=60",
             binary("cddp-train"), *TINY, *args], env=env()))
        if i == 0 and backend == "c10d":  # (the host binds first)
            wait_status(sports[0], lambda s: s["state"] in ("rendezvous", "running"), timeout=30)
    return agents, sports


@pytest.mark.parametrize("backend", ["c10d", pytest.param("etcd-v3", marks=NO_ETCD)])
def test_two_nodes_one_worker_restarted_alone(background, reference, request, backend):
    """Rank 3, node 1's second worker, crashes at step 2. Its agent asks
    the rendezvous for the group's next generation (`replace`): the c10d
    server grants it; over etcd-v3 the agent applies it to the run's state
    key (a transaction compared on its revision) and the others' watches
    bring it. Node 0 announces generation 1 on its agent store, node 1
    restarts rank 3 alone, and every rank re-forms with rank 0's state: the
    same checksum as the no-fault run, ranks 0, 1 and 2 in their first
    processes, no group restart on either node, one counted restart on both
    (docs/multi-node.md, "A worker restarted alone"; docs/etcd.md). Not
    heavy: the agents' and the rendezvous' side of it under ASan too."""
    agents, sports = two_agents(background, request, backend, "inplace2", (2, 2),
                                ["--fault", "crash@step=2,rank=3"])
    ends = [succeeded(a, p) for a, p in zip(agents, sports)]
    by_ranks = {tuple(w["rank"] for w in st["workers"]): (st, err) for st, err in ends}
    assert sorted(by_ranks) == [(0, 1), (2, 3)], [st["workers"] for st, _ in ends]
    (st0, err0), (st1, err1) = by_ranks[(0, 1)], by_ranks[(2, 3)]
    assert [w["restarts"] for w in st0["workers"]] == [0, 0]
    assert [w["restarts"] for w in st1["workers"]] == [0, 1]
    assert st1["restarts"]["by_scope"] == {"worker": 1, "group": 0}
    assert st0["restarts"]["by_scope"] == {"worker": 0, "group": 0}
    assert st0["restarts"]["generation"] == st1["restarts"]["generation"] == 1
    # one of the job's --max_restarts, counted on both nodes alike
    assert st0["restarts"]["count"] == st1["restarts"]["count"] == 1, (st0["restarts"],
                                                                       st1["restarts"])
    # node 1 asked and restarted rank 3 alone; node 0 heard of it
    assert "A0234" in err1 and err1.count("A0220") == 1, err1[-5000:]
    assert re.search(r"A0236: .*generation 1, rank 3 restarted alone by node", err0), err0[-5000:]
    for err in (err0, err1):
        assert err.count("A0207") == 1 and "A0401" not in err and "A0235" not in err, \
            err[-5000:]
    err = err0 + err1
    assert len(re.findall(r"T6212: generation 1: state from rank 0, checksum \w+; running step 2",
                          err)) == 4, err[-5000:]
    assert err.count("T6202") == 4 and checksums(err) == reference, err[-5000:]
    survivors_kept(err, {3})


@pytest.mark.parametrize("backend", [pytest.param("c10d", marks=pytest.mark.heavy),
                                     pytest.param("etcd-v3", marks=NO_ETCD)])
def test_two_nodes_hung_rank_named_by_the_other_node(background, reference, request, backend):
    """Node 0 runs ranks 0-2, node 1 rank 3 alone; rank 3 hangs before
    step 2's first collective. Only node 0's ranks can name it (their
    collectives time out): node 0's agent passes the blame on through the
    rendezvous (c10d: `blame`; etcd-v3: a key under news/blame/ that node
    1's agent sees on its watch), node 1's agent kills rank 3 and asks to
    restart it alone (`replace`), and the four re-form well before
    --init-timeout: the no-fault checksum, ranks 0-2 in their first
    processes. Heavy over c10d; over etcd-v3 it also runs under ASan."""
    agents, sports = two_agents(background, request, backend, "blame2", (3, 1),
                                ["--init-timeout", "60", "--collective-timeout", "3",
                                 "--fault", "hang@step=2,rank=3"])
    ends = [succeeded(a, p) for a, p in zip(agents, sports)]
    by_ranks = {tuple(w["rank"] for w in st["workers"]): (st, err) for st, err in ends}
    assert sorted(by_ranks) == [(0, 1, 2), (3,)], [st["workers"] for st, _ in ends]
    (st0, err0), (st1, err1) = by_ranks[(0, 1, 2)], by_ranks[(3,)]
    assert [w["restarts"] for w in st1["workers"]] == [1]
    assert st0["restarts"]["by_scope"] == {"worker": 0, "group": 0}
    assert st1["restarts"]["by_scope"] == {"worker": 1, "group": 0}
    # node 0 passed the blame on once; node 1 killed rank 3 for it
    assert err0.count("passed on to its node's agent through the rendezvous") == 1, err0[-5000:]
    assert re.search(r"A0224: .*local_rank 0 \(rank 3, pid \d+\) never reached a collective "
                     r"that a rank on node \S+ waited for \(generation 0\)", err1), err1[-5000:]
    assert "A0234" in err1 and err1.count("A0220") == 1, err1[-5000:]
    err = err0 + err1
    assert "exit 75" not in err and err.count("A0207") == 2, err[-5000:]
    assert err.count("T6202") == 4 and checksums(err) == reference, err[-5000:]
    survivors_kept(err, {3})


@pytest.mark.parametrize("backend", ["c10d", pytest.param("etcd-v3", marks=NO_ETCD)])
def test_two_nodes_whole_node_hung(background, reference, request, backend):
    """Node 1's two ranks (2 and 3) hang together before step 2's first
    collective. Node 0's ranks name both; the blame crosses over; node 1's
    agent kills both, waits for both exits, and asks for one generation
    replacing both: `replace` with `ranks` "2,3" (c10d: the server grants
    it; etcd-v3: the agent applies it to the state, `gen_ranks`). One
    generation, one counted restart, node 0's ranks in their first
    processes, the no-fault checksum. Not heavy: the server's and the
    state's side under ASan too."""
    agents, sports = two_agents(background, request, backend, "node-hung", (2, 2),
                                ["--init-timeout", "60", "--collective-timeout", "3",
                                 "--fault", "hang@step=2,rank=2-3"], max_restarts=2)
    ends = [succeeded(a, p) for a, p in zip(agents, sports)]
    by_ranks = {tuple(w["rank"] for w in st["workers"]): (st, err) for st, err in ends}
    assert sorted(by_ranks) == [(0, 1), (2, 3)], [st["workers"] for st, _ in ends]
    (st0, err0), (st1, err1) = by_ranks[(0, 1)], by_ranks[(2, 3)]
    err = err0 + err1
    for r in (2, 3):
        assert re.search(rf"A0224: .*local_rank {r - 2} \(rank {r}, pid \d+\) never reached", err1), \
            err1[-5000:]
    assert err.count("T6202") == 4 and checksums(err) == reference, err[-5000:]
    assert re.search(r"A0234: .*ranks 2,3 failed together \(hung\); asking the rendezvous to "
                     r"restart them together in one generation", err1), err1[-5000:]
    assert re.search(r"A0236: .*generation 1, ranks 2,3 restarted alone by node", err0), \
        err0[-5000:]
    assert err1.count("A0220") == 2 and "A0235" not in err, err[-5000:]
    assert [w["restarts"] for w in st1["workers"]] == [1, 1]
    assert [w["restarts"] for w in st0["workers"]] == [0, 0]
    assert st1["restarts"]["by_scope"] == {"worker": 1, "group": 0}
    assert st0["restarts"]["by_scope"] == {"worker": 0, "group": 0}
    assert st0["restarts"]["count"] == st1["restarts"]["count"] == 1
    assert st0["restarts"]["generation"] == st1["restarts"]["generation"] == 1
    assert "exit 75" not in err and err.count("A0207") == 2, err[-5000:]
    assert len(re.findall(r"T6212: generation 1: state from rank 0, checksum \w+; running step 2",
                          err)) == 4, err[-5000:]
    survivors_kept(err, {2, 3})


@NO_ETCD
def test_two_nodes_over_etcd_second_failure_restarts_the_group(background, reference, request):
    """Ranks 1 and 3, one on each node, SIGKILLed together over etcd-v3.
    The first agent to ask restarts its rank alone; the second either asks
    too, its transaction conflicts, is applied again to the new state and
    refused inside the settle window (A0235), or it has already heard of
    the first one's generation and restarts its group without asking (its
    own settle window: a slower machine, ASan). Either way that node
    restarts the group, and the run still succeeds on the no-fault
    checksum (the group starts again from step 0; the slowdown that kept
    the run alive long enough is in restart 0 only)."""
    agents, sports = two_agents(background, request, "etcd-v3", "inplace-etcd2", (2, 2),
                                ["--fault", "slow@step=0,ms=400,for=8"], max_restarts=2)
    sts = [wait_status(p, lambda s: s["state"] == "running" and all(
        (w.get("progress") or {}).get("step", 0) >= 1 for w in s["workers"]), timeout=120)
        for p in sports]
    victims = [w["pid"] for st in sts for w in st["workers"] if w["rank"] in (1, 3)]
    assert len(victims) == 2, [st["workers"] for st in sts]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    ends = [succeeded(a, p) for a, p in zip(agents, sports)]
    err = "".join(err for _, err in ends)
    # the first asked and was granted; the second was refused, or did not ask
    assert 1 <= err.count("A0234") <= 2 and err.count("A0220") == 1, err[-6000:]
    assert err.count("A0235") == err.count("A0234") - 1, err[-6000:]
    if "A0235" in err:
        assert re.search(r"A0235: .*refused to restart the worker alone: generation 1 was "
                         r"granted \d+ ms ago", err), err[-6000:]
    fell_back = [st["restarts"] for st, e_ in ends if "A0220" not in e_]
    granted = [st["restarts"] for st, e_ in ends if "A0220" in e_]
    assert len(fell_back) == len(granted) == 1, err[-6000:]
    # the node that fell back restarted its group for its own failure; the
    # granted one had restarted its rank alone, then restarted its group
    # too, following the new round (a membership change by reason; by
    # scope the group restart the job counted, as on the other node);
    # both count the job's two restarts (the grant and the group's)
    assert fell_back[0]["by_scope"] == {"worker": 0, "group": 1}, fell_back
    assert granted[0]["by_scope"] == {"worker": 1, "group": 1}, granted
    assert granted[0]["by_reason"]["membership_change"] == 1, granted
    for st, e_ in ends:
        assert st["restarts"]["count"] == 2 and st["restarts"]["generation"] == 0, st["restarts"]
        assert e_.count("A0207") == 2, e_[-5000:]
    assert checksums(err) == reference and err.count("T6202") == 4, err[-5000:]


# Every rank runs allreduces; rank 1 dies in the first attempt, and with it
# (gloo raises in the peers) the others: the replacement is not yet
# re-formed, so the agent restarts the whole group, which then finishes.
TORCH_SCRIPT = r"""
import os, sys, time, torch, torch.distributed as dist
a = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo", init_method="env://")
r = dist.get_rank()
for i in range(40):
    t = torch.ones(4)
    dist.all_reduce(t)
    if i == 5 and r == 1 and a == 0:
        os._exit(1)
    time.sleep(0.02)
dist.destroy_process_group()
os.write(1, ("DONE %d %d\n" % (r, a)).encode())
"""


@pytest.mark.heavy
def test_torch_script_falls_back_to_a_group_restart(tmp_path, torch_python):
    script = tmp_path / "t.py"
    script.write_text(TORCH_SCRIPT)
    r = run([binary("cddprun"), "--nproc_per_node=3", f"--master_port={free_port()}",
             "--max_restarts=3", "--restart_scope=worker", script], env=env(), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]
    # the first failure restarted rank 1 alone; the others' failures (in the
    # settle window, before the replacement re-formed) restarted the group
    assert r.stderr.count("A0220") == 1, r.stderr[-5000:]
    assert re.search(r"A0207: \[default\] starting 3 workers \(attempt 2, restart count 2/3\)",
                     r.stderr), r.stderr[-5000:]
    assert sorted(re.findall(r"DONE (\d) (\d)", r.stdout)) == [("0", "2"), ("1", "2"),
                                                               ("2", "2")], r.stdout


def test_bad_scope_is_one_line():
    r = run([binary("cddprun"), "--restart_scope=node", "true"])
    assert r.returncode == 2
    assert "--restart_scope" in r.stderr and "group" in r.stderr and "worker" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run([binary("cddprun"), "--agent_store=false", "true"], env=dict(
        os.environ, CDDP_RESTART_SCOPE="worker"))
    assert r.returncode == 2
    assert "--restart_scope=worker needs --agent_store=true" in r.stderr, r.stderr
