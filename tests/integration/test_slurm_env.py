"""cddprun inside a Slurm step, without Slurm: a synthetic SLURM_*
environment (what srun gives each task) is enough for cddprun to derive
its flags (docs/slurm.md). Two agents on this host play the step's two
nodes; their workers write their environment, which is what the test
checks. Flags and PET_* win; --no_slurm and CDDP_NO_SLURM turn it off;
bad SLURM_* values and several tasks per node are refused; a handled
SIGUSR1 (preemption) reaches the workers and shows in the exit status.

tests/integration/test_slurm.py does the same under a real slurmctld and
slurmd.
"""
import os
import random
import signal
import socket

import pytest

from conftest import binary, run, wait_for
from test_launcher import read_env, script


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def job_with_free_port(step=0):
    """A job id whose derived rendezvous port (29400 + (job + step) % 1000) is free."""
    for _ in range(200):
        job = random.randrange(100000, 999999)
        port = 29400 + (job + step) % 1000
        if port_free(port):
            return job, port
    pytest.skip("no free port in 29400-30399 for the derived rendezvous")


def slurm_env(job, nodeid, nnodes=2, step=0, nodelist=None, **extra):
    """The environment srun gives the task of a step on node `nodeid`."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_"))}
    e.pop("CDDP_NO_SLURM", None)
    e.update({
        "SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_STEP_ID": str(step),
        "SLURM_STEPID": str(step), "SLURM_NNODES": str(nnodes),
        "SLURM_STEP_NUM_NODES": str(nnodes), "SLURM_NODEID": str(nodeid),
        "SLURM_JOB_NODELIST": nodelist or "localhost,cddpnode[2-9]",
        "SLURM_STEP_NODELIST": nodelist or "localhost,cddpnode[2-9]",
        "SLURM_STEP_TASKS_PER_NODE": f"1(x{nnodes})", "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_LOCALID": "0", "SLURM_PROCID": str(nodeid), "LOGLEVEL": "INFO",
    })
    e.update({k: str(v) for k, v in extra.items()})
    return e


def dump_worker(tmp_path):
    return script(tmp_path, "dump", f'env > "{tmp_path}/env.$RANK"\n')


def test_two_nodes_from_slurm_env(tmp_path, background):
    job, port = job_with_free_port()
    w = dump_worker(tmp_path)
    agents = [background([binary("cddprun"), str(w)], env=slurm_env(job, n)) for n in (1, 0)]
    codes = [a.wait(timeout=90) for a in agents]
    assert codes == [0, 0], [a.err for a in agents]
    envs = [read_env(tmp_path / f"env.{r}") for r in range(4)]
    for e in envs:
        assert e["WORLD_SIZE"] == "4"
        assert e["LOCAL_WORLD_SIZE"] == "2"  # SLURM_NTASKS_PER_NODE
        assert e["GROUP_WORLD_SIZE"] == "2"
        assert e["TORCHELASTIC_RUN_ID"] == f"{job}.0"
        assert e["TORCHELASTIC_SIGNALS_TO_HANDLE"] == \
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
    assert sorted(e["GROUP_RANK"] for e in envs) == ["0", "0", "1", "1"]
    node1, node0 = agents
    for a, nid in ((node0, 0), (node1, 1)):
        lines = [ln for ln in a.err.splitlines() if "L2100" in ln]
        assert len(lines) == 1, a.err  # logged once
        ln = lines[0]
        assert f"Slurm job {job} step 0, node {nid} of 2" in ln
        assert "--nnodes=2 (SLURM_STEP_NUM_NODES)" in ln
        assert f"--node_rank={nid} (SLURM_NODEID)" in ln
        assert (f"--rdzv_endpoint=localhost:{port} (first host of "
                "SLURM_STEP_NODELIST=localhost,cddpnode[2-9])") in ln
        assert f"--rdzv_id={job}.0" in ln
        assert "--nproc_per_node=2 (SLURM_NTASKS_PER_NODE)" in ln
        assert "--rdzv_backend=c10d" in ln
    assert "this agent hosts the rendezvous (node 0)" in node0.err
    assert "node 0's agent hosts the rendezvous" in node1.err
    assert f"hosting the rendezvous of run '{job}.0'" in node0.err
    assert "hosting the rendezvous" not in node1.err


def test_gpus_on_node_and_flags_win(tmp_path):
    job, _ = job_with_free_port()
    w = dump_worker(tmp_path)
    # SLURM_GPUS_ON_NODE is the worker count when set.
    r = run([binary("cddprun"), str(w)], timeout=60,
            env=slurm_env(job, 0, nnodes=1, nodelist="localhost", SLURM_GPUS_ON_NODE=3))
    assert r.returncode == 0, r.stderr
    assert read_env(tmp_path / "env.2")["LOCAL_WORLD_SIZE"] == "3"
    assert "--nproc_per_node=3 (SLURM_GPUS_ON_NODE)" in r.stderr
    for f in tmp_path.glob("env.*"):
        f.unlink()
    # A flag and a PET_ variable win over Slurm's values, and the log says so.
    r = run([binary("cddprun"), "--nproc_per_node=1", "--signals_to_handle=SIGTERM", str(w)],
            timeout=60, env=slurm_env(job, 0, nnodes=1, nodelist="localhost",
                                      PET_RDZV_ID="mine"))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.glob("env.*")) == ["env.0"]
    e = read_env(tmp_path / "env.0")
    assert e["TORCHELASTIC_RUN_ID"] == "mine"
    assert e["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM"
    assert ("kept as given: --rdzv_id (PET_RDZV_ID), --nproc_per_node (command line), "
            "--signals_to_handle (command line)") in r.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_no_slurm(tmp_path, how):
    w = dump_worker(tmp_path)
    # Two nodes in the environment: without --no_slurm this run would wait for node 1.
    env = slurm_env(4242, 0)
    args = [binary("cddprun"), str(w)]
    if how == "flag":
        args.insert(1, "--no_slurm")
    else:
        env["CDDP_NO_SLURM"] = "1"
    r = run(args, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    e = read_env(tmp_path / "env.0")
    assert e["WORLD_SIZE"] == "1"
    assert e["TORCHELASTIC_RUN_ID"] == "none"
    assert e["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    assert "L2102" in r.stderr and "L2100" not in r.stderr


def test_outside_a_step(tmp_path):
    w = dump_worker(tmp_path)
    env = slurm_env(4242, 0)
    for k in ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
              "SLURM_STEP_TASKS_PER_NODE"):
        env.pop(k)
    r = run([binary("cddprun"), str(w)], timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert read_env(tmp_path / "env.0")["WORLD_SIZE"] == "1"
    assert "L2101" in r.stderr and "not in a job step" in r.stderr


@pytest.mark.parametrize("extra,want", [
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
     "srun started 2 tasks of this step on this node (SLURM_STEP_TASKS_PER_NODE=2(x2))"),
    ({"SLURM_STEP_NODELIST": "node[1-"},
     "SLURM_STEP_NODELIST: host list 'node[1-': the range at offset 5 has no upper bound"),
    ({"SLURM_STEP_NODELIST": "n[3-1]"}, "the range 3-1 at offset 2 goes down"),
    ({"SLURM_NODEID": "5"}, "SLURM_NODEID='5' is not a node index (0-1)"),
    ({"SLURM_STEP_NUM_NODES": "many"}, "SLURM_STEP_NUM_NODES='many' is not a number of nodes"),
])
def test_bad_slurm_env(tmp_path, extra, want):
    w = dump_worker(tmp_path)
    r = run([binary("cddprun"), str(w)], timeout=30, env=slurm_env(4242, 1, **extra))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and want in lines[0], r.stderr
    assert not list(tmp_path.glob("env.*"))


def signal_worker(tmp_path):
    """Records each signal it gets (one line per signal) and ends on it
    (exit 0), as a job that checkpoints on preemption would."""
    return script(tmp_path, "sigworker", f"""
out="{tmp_path}/sig.$RANK"
trap 'echo USR1 >> "$out"; exit 0' USR1
trap 'echo USR2 >> "$out"; exit 0' USR2
trap 'echo TERM >> "$out"; exit 0' TERM
touch "{tmp_path}/ready.$RANK"
while :; do sleep 0.1; done
""")


@pytest.mark.parametrize("sig,code", [(signal.SIGUSR1, 138), (signal.SIGUSR2, 140),
                                      (signal.SIGTERM, 143)])
def test_preemption_signal_reaches_workers(tmp_path, background, sig, code):
    job, _ = job_with_free_port()
    w = signal_worker(tmp_path)
    a = background([binary("cddprun"), str(w)],
                   env=slurm_env(job, 0, nnodes=1, nodelist="localhost"))
    wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, timeout=60, what="workers")
    a.signal(sig)
    assert a.wait(timeout=60) == code, a.err  # 128 + the signal: preempted, not failed
    name = signal.Signals(sig).name[3:]
    for r in range(2):
        assert (tmp_path / f"sig.{r}").read_text().split() == [name]


def test_failure_is_not_preemption(tmp_path):
    w = script(tmp_path, "fail", "exit 3\n")
    r = run([binary("cddprun"), str(w)], timeout=60,
            env=slurm_env(4242, 0, nnodes=1, nodelist="localhost"))
    assert r.returncode == 1, r.stderr


SBATCH = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "slurm", "train.sbatch")


def test_example_sbatch_requeues_on_preemption_and_infrastructure_only(tmp_path):
    """examples/slurm/train.sbatch's exit handling, its srun and scontrol
    replaced by stand-ins on PATH (srun exits with cddprun's code, scontrol
    records what it was asked): the job is requeued on preemption (128 +
    signal) and on the infrastructure's 5, never on a failure, a usage
    error, a hang or no progress (docs/cli.md, "Exit codes"); the script
    exits with cddprun's code either way."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    script(bin_, "srun", 'exit "$FAKE_RC"\n')
    script(bin_, "scontrol", 'echo "$@" >> "$LOG"\n')
    for rc, requeued in ((0, False), (1, False), (2, False), (3, False), (4, False), (5, True),
                         (138, True), (143, True)):
        log = tmp_path / f"scontrol.{rc}"
        env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", FAKE_RC=str(rc),
                   SLURM_JOB_ID="77", LOG=str(log))
        r = run(["bash", SBATCH], env=env)
        assert r.returncode == rc, (rc, r.stdout, r.stderr)
        assert (log.read_text() if log.exists() else "") == ("requeue 77\n" if requeued else ""), \
            (rc, r.stdout)
