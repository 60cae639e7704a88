"""cddprun under a real Slurm: slurmctld, two slurmd and munged (Debian's
slurm-wlm and munge) started by the fixture on this machine.

Debian's slurmd is built without --enable-multiple-slurmd, so each node is
a pair of namespaces of its own: a network namespace with a veth on a
bridge the fixture creates (10.77.N.0/24, N chosen free), a UTS namespace
with the node's host name (n1, n2), and a mount namespace in which a hosts
file the fixture writes is bound over /etc/hosts, so the node names
resolve there as a cluster's DNS would. slurmctld and munged run in this
namespace; srun, squeue and scancel run on n1, as from a login node.
Everything lives in a temporary directory and is torn down at the end of
the module, whatever happened: jobs cancelled, daemons stopped (TERM,
then KILL), every process left in a node's namespaces killed, the bridge
deleted. Without root, the binaries or namespaces, the module skips with
the reason; daemons that do not come up skip it with their logs' tail.

The tests: `srun -N2 --ntasks-per-node=1 cddprun cddp-train ...` trains
across the two nodes with no flag for the layout (docs/slurm.md);
`scancel --signal=USR1` reaches every worker through the agents and the
step ends with 138 (128 + SIGUSR1: preempted), where a failing worker ends
it with 1.
"""
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import binary, free_port, wait_for

pytestmark = pytest.mark.heavy

TOOLS = ["slurmctld", "slurmd", "srun", "squeue", "scancel", "sinfo", "munged", "ip", "unshare",
         "nsenter"]
NODES = ["n1", "n2"]


def _sh(*args, check=True, timeout=30, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=check,
                          timeout=timeout, **kw)


def _tail(path, n=15):
    try:
        return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _free_subnet():
    used = _sh("ip", "-4", "-o", "addr", check=False).stdout
    for _ in range(50):
        n = random.randrange(150, 250)
        if f"10.77.{n}." not in used:
            return f"10.77.{n}"
    return None


class Cluster:
    """The fixture's cluster: run(cmd) runs on n1 (the login node)."""

    def __init__(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="cddp-slurm-"))
        self.dir.chmod(0o755)
        self.tag = "%04x" % random.randrange(0x10000)
        self.bridge = f"cddpsl{self.tag}"
        self.daemons = []  # Popen, in start order
        self.holders = {}  # node -> Popen of the process that holds its namespaces
        self.links = []
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "PET_")) and k != "CDDP_TEST_TAG"}
        self.env["SLURM_CONF"] = str(self.dir / "slurm.conf")

    # ---- set-up ----
    def start(self):
        d = self.dir
        subnet = _free_subnet()
        if subnet is None:
            pytest.skip("no free 10.77.N.0/24 subnet for the cluster's bridge")
        self.addr = {"ctl": f"{subnet}.1", "n1": f"{subnet}.2", "n2": f"{subnet}.3"}
        (d / "hosts").write_text("127.0.0.1 localhost\n" +
                                 "".join(f"{a} {n}\n" for n, a in self.addr.items()))
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.ctl_port = free_port()
        (d / "slurm.conf").write_text(f"""\
ClusterName=cddp{self.tag}
SlurmctldHost=localhost({self.addr['ctl']})
SlurmctldPort={self.ctl_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
MailProg=/bin/true
FirstJobId={random.randrange(1000, 900000)}
KillWait=10
NodeName=n1 NodeAddr={self.addr['n1']} CPUs=1 State=UNKNOWN
NodeName=n2 NodeAddr={self.addr['n2']} CPUs=1 State=UNKNOWN
PartitionName=cddp Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self._daemon(["munged", "--foreground", f"--key-file={key}", f"--socket={d}/munge.sock",
                      f"--pid-file={d}/munged.pid", f"--log-file={d}/log/munged.log",
                      f"--seed-file={d}/munge.seed", "--force"], "munged.out")
        wait_for(lambda: (d / "munge.sock").exists(), timeout=20, what="munged's socket")

        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.links.append(self.bridge)
        _sh("ip", "addr", "add", f"{self.addr['ctl']}/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for i, node in enumerate(NODES):
            self._node(i, node)

        self._daemon(["slurmctld", "-D", "-i", "-f", d / "slurm.conf"], "slurmctld.out")
        for node in NODES:
            self._daemon(self.on(node, "slurmd", "-D", "-f", d / "slurm.conf", "-N", node),
                         f"slurmd.{node}.out")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            if states.count("idle") == 2:
                return
            dead = [p for p in self.daemons if p.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        logs = "\n".join(f"== {p.name}\n{_tail(p)}" for p in sorted((d / "log").glob("*")))
        pytest.skip(f"the Slurm daemons did not come up (sinfo: {states}):\n{logs}")

    def _daemon(self, args, out):
        fh = open(self.dir / "log" / out, "w")
        self.daemons.append(subprocess.Popen([str(a) for a in args], stdout=fh,
                                             stderr=subprocess.STDOUT, env=self.env,
                                             start_new_session=True))
        fh.close()

    def _node(self, i, node):
        holder = subprocess.Popen(
            ["unshare", "--net", "--uts", "--mount", "--propagation", "private", "sh", "-c",
             f"mount --bind {self.dir}/hosts /etc/hosts && hostname {node} && "
             "exec sleep 100000"], env=self.env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.holders[node] = holder

        def ready():
            if holder.poll() is not None:
                pytest.skip(f"cannot make a node's namespaces: {holder.stderr.read()}")
            r = _sh("nsenter", "-t", holder.pid, "-u", "hostname", check=False)
            return r.stdout.strip() == node
        wait_for(ready, timeout=20, what=f"{node}'s namespaces")
        outer, inner = f"cs{self.tag}{i}a", f"cs{self.tag}{i}b"
        _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        self.links.append(outer)
        _sh("ip", "link", "set", outer, "master", self.bridge, "up")
        _sh("ip", "link", "set", inner, "netns", str(holder.pid))
        inside = ["nsenter", "-t", str(holder.pid), "-n", "ip"]
        _sh(*inside, "link", "set", "lo", "up")
        _sh(*inside, "addr", "add", f"{self.addr[node]}/24", "dev", inner)
        _sh(*inside, "link", "set", inner, "up")

    # ---- use ----
    def on(self, node, *cmd):
        """cmd inside node's namespaces (its network, name and /etc/hosts)."""
        return ["nsenter", "-t", str(self.holders[node].pid), "-n", "-u", "-m",
                f"-w{os.getcwd()}", *[str(c) for c in cmd]]

    def run(self, *cmd, timeout=60, check=False, env=None):
        e = dict(os.environ if env is None else env)
        e["SLURM_CONF"] = self.env["SLURM_CONF"]
        return subprocess.run(self.on("n1", *cmd), capture_output=True, text=True, check=check,
                              timeout=timeout, env=e)

    def popen(self, *cmd, **kw):
        e = dict(os.environ)
        e["SLURM_CONF"] = self.env["SLURM_CONF"]
        return subprocess.Popen(self.on("n1", *cmd), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=e, **kw)

    # ---- teardown: every step tolerates what went before failing ----
    def stop(self):
        if self.holders:
            try:
                self.run("scancel", "--quiet", "--user=root", timeout=15)
            except (subprocess.SubprocessError, OSError):
                pass
        for p in reversed(self.daemons):
            _stop(p)
        nets = set()
        for h in self.holders.values():
            try:
                nets.add(os.readlink(f"/proc/{h.pid}/ns/net"))
            except OSError:
                pass
        # Whatever still runs in a node's network namespace (a task
        # slurmstepd left, a worker) is killed with it.
        me = os.readlink("/proc/self/ns/net")
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                ns = os.readlink(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            if ns in nets and ns != me:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        for h in self.holders.values():
            _stop(h)
        for link in reversed(self.links):
            _sh("ip", "link", "del", link, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def _stop(p):
    if p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except OSError:
            pass
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("the Slurm cluster fixture needs root (daemons, namespaces, a bridge)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (tools/setup.sh installs slurm-wlm, "
                    "munge, iproute2)")
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


SMALL = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
         "10", "--epochs", "1", "--log-every", "1"]


def test_srun_trains_across_two_nodes(cluster, tmp_path):
    tmp_path.chmod(0o755)
    env = dict(os.environ, LOGLEVEL="DEBUG")
    r = cluster.run("srun", "-N2", "--ntasks-per-node=1", "--time=5", "--label",
                    binary("cddprun"), f"--log_dir={tmp_path}/logs", binary("cddp-train"),
                    *SMALL, "--num-samples", "16", "--batch-size", "4", "--steps", "2",
                    timeout=300, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    # Each node's agent took its layout from Slurm, and logged it once.
    derived = re.findall(r"^(\d): .*L2100: Slurm job (\d+) step 0, node (\d) of 2: (.*)$", out,
                         re.M)
    assert sorted(d[2] for d in derived) == ["0", "1"], out[-4000:]
    for task, job, node, text in derived:
        assert task == node  # srun's task i runs on node i here
        assert "--nnodes=2 (SLURM_STEP_NUM_NODES)" in text
        port = 29400 + int(job) % 1000
        assert f"--rdzv_endpoint=n1:{port} (first host of SLURM_STEP_NODELIST=n[1-2])" in text
        assert f"--rdzv_id={job}.0" in text
        assert "--nproc_per_node=1 (SLURM_NTASKS_PER_NODE)" in text
    # Two ranks on two nodes trained the same model.
    sums = dict(re.findall(r"cddp-train\[\d+\] rank(\d+) \S+ \w+ T6202: after \d+ steps: state "
                           r"checksum (\w+)", out))
    assert sorted(sums) == ["0", "1"], out[-4000:]
    assert len(set(sums.values())) == 1, sums
    hosts = set(re.findall(r"rendezvous complete: round 1, group_rank=\d+ group_world_size=2 "
                           r"world_size=2 master=([\d.]+):", out))
    assert hosts == {cluster.addr["n1"]}, out[-4000:]  # node 0's address, over the bridge


def _sig_worker(tmp_path):
    p = tmp_path / "sigworker"
    p.write_text(f"""#!/bin/sh
out="{tmp_path}/sig.$RANK"
trap 'echo USR1 $(hostname) >> "$out"; exit 0' USR1
trap 'echo TERM $(hostname) >> "$out"; exit 0' TERM
echo "$(hostname)" > "{tmp_path}/ready.$RANK"
while :; do sleep 0.2; done
""")
    p.chmod(0o755)
    return p


def test_scancel_usr1_reaches_every_worker(cluster, tmp_path):
    tmp_path.chmod(0o755)
    w = _sig_worker(tmp_path)
    step = cluster.popen("srun", "-N2", "--ntasks-per-node=1", "--time=5", "--label",
                         binary("cddprun"), "--nproc_per_node=2", w)
    try:
        wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 4 or step.poll() is not None,
                 timeout=120, what="four workers on two nodes")
        assert step.poll() is None, step.communicate()
        hosts = sorted((tmp_path / f"ready.{r}").read_text().strip() for r in range(4))
        assert hosts == ["n1", "n1", "n2", "n2"]
        jobs = cluster.run("squeue", "-h", "-o", "%i").stdout.split()
        assert len(jobs) == 1, jobs
        r = cluster.run("scancel", "--signal=USR1", jobs[0])
        assert r.returncode == 0, r.stderr
        out, err = step.communicate(timeout=120)
    finally:
        if step.poll() is None:
            step.kill()
            step.communicate()
    # Every worker got SIGUSR1 once, through its agent, and the step says
    # "preempted": 128 + SIGUSR1.
    for r in range(4):
        lines = (tmp_path / f"sig.{r}").read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith("USR1 "), lines
    assert step.returncode == 128 + signal.SIGUSR1, err[-3000:]
    assert err.count("Received SIGUSR1 death signal") == 2, err[-3000:]


def test_failure_exits_one(cluster, tmp_path):
    tmp_path.chmod(0o755)
    w = tmp_path / "fail"
    w.write_text("#!/bin/sh\nexit 3\n")
    w.chmod(0o755)
    r = cluster.run("srun", "-N2", "--ntasks-per-node=1", "--time=5", binary("cddprun"), w,
                    timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr


def test_example_sbatch_script(cluster, tmp_path):
    """examples/slurm/train.sbatch as users submit it (its #SBATCH lines:
    two nodes, one task each), with a small training run as its arguments."""
    tmp_path.chmod(0o755)
    script = pathlib.Path(__file__).resolve().parents[2] / "examples" / "slurm" / "train.sbatch"
    env = dict(os.environ, CDDPRUN=binary("cddprun"), CDDP_TRAIN=binary("cddp-train"),
               LOGLEVEL="INFO")
    r = cluster.run("sbatch", "--wait", f"--chdir={tmp_path}", "--time=5",
                    f"--output={tmp_path}/job.out", script, *SMALL, "--num-samples", "16",
                    "--batch-size", "4", "--steps", "2", timeout=300, env=env)
    out = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr + out[-4000:]
    assert "cddp-train: done" in out, out[-4000:]
    assert out.count("L2100: Slurm job") == 2, out[-4000:]
    assert "group_world_size=2 world_size=2" in out, out[-4000:]


def test_tasks_per_node_of_the_job_are_workers(cluster, tmp_path):
    """A job of two tasks per node, one cddprun per node (srun -N2 -n2):
    two workers per node; srun --ntasks-per-node=2 (two agents per node) is
    refused on every task, before anything starts."""
    tmp_path.chmod(0o755)
    w = tmp_path / "dump"
    w.write_text(f'#!/bin/sh\necho "$(hostname) $LOCAL_WORLD_SIZE $WORLD_SIZE" > '
                 f'"{tmp_path}/w.$RANK"\n')
    w.chmod(0o755)
    r = cluster.run("salloc", "-N2", "--ntasks-per-node=2", "--overcommit", "--time=5",
                    "srun", "-N2", "-n2", binary("cddprun"), w, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = sorted((tmp_path / f"w.{i}").read_text().split()[0] for i in range(4))
    assert seen == ["n1", "n1", "n2", "n2"]
    assert all((tmp_path / f"w.{i}").read_text().split()[1:] == ["2", "4"] for i in range(4))

    for f in tmp_path.glob("w.*"):
        f.unlink()
    r = cluster.run("srun", "-N2", "--ntasks-per-node=2", "--overcommit", "--time=5",
                    binary("cddprun"), w, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("srun started 2 tasks of this step on this node") == 4, r.stderr
    assert not list(tmp_path.glob("w.*"))  # no worker ran
