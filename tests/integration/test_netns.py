"""Many hosts for real (issue 15): cddprun over a cluster of network
namespaces (tests/netns.py), each host with its own hostname, which resolves
nowhere, and its own address on a bridge.

What is asserted:
  - interface choice: without GLOO_SOCKET_IFNAME from the user, every worker
    gets GLOO_SOCKET_IFNAME=NCCL_SOCKET_IFNAME=eth0 (the interface towards
    the endpoint) and MASTER_ADDR is node 0's address on it; /status says
    so; a user's variable wins; --no_ifname (and CDDP_NO_IFNAME) leaves
    them unset;
  - cddp-train and the seed DDP script (torch, gloo) train across two hosts
    with no interface set by the user (the seed script fails at once
    otherwise: gloo resolves the hostname and falls back to loopback);
  - a host partitioned longer than the keep-alive window: its workers stop
    within about the window, the others restart without it (elastic) or
    wait for it (fixed size), it rejoins as a new member when its link comes
    back, and the job finishes at full size; a blip shorter than the window
    restarts nothing;
  - 50 ms latency and 1% loss on every link (tc netem; skipped where the
    kernel has no sch_netem): the round forms, the job completes, nothing
    restarts;
  - what kernels without netem have: random loss (nftables numgen) and a
    rate limit (tc tbf) on every link: a bulk transfer shows both bite,
    the round forms, the job completes, nothing restarts; cddp-train
    under loss and a rate limit ends with the clean run's checksum;
  - a host that crashes (everything SIGKILLed, link cut): the others go on;
  - --restart_scope=worker with a spare host waiting: a lost host's place
    is taken by the spare, the survivors keep their workers, and
    cddp-train ends on the no-fault checksum; without a spare (the world
    would shrink) the group restarts, on a fresh agent store;
  - a rendezvous server that is down while its host is up (connections
    refused) is not a partition: the workers run on past the window.
The recovery times are printed (pytest -s) as "netns figure: ...".
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from conftest import ROOT, TORCH_PY, binary, wait_for
from netns import netns_cluster  # noqa: F401 (the fixture)
from netns import running as alive

# Records the variables a worker got (one file per start), then runs until
# $OUT/finish exists (or LIFETIME seconds), then exits 0.
WORKER = r"""#!/bin/sh
f="$OUT/w.$$"
{ env | grep -E '^(RANK|WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT|GLOO_SOCKET_IFNAME|NCCL_SOCKET_IFNAME|TORCHELASTIC_RESTART_COUNT|NODE)='
  echo "PID=$$"; echo "HOST=$(hostname)"; echo "T=$(date +%s.%N)"; } > "$f.tmp" && mv "$f.tmp" "$f.env"
n=0
while [ ! -e "$OUT/finish" ]; do
    sleep 0.05
    n=$((n + 1))
    if [ -n "$LIFETIME" ] && [ "$n" -ge "$((LIFETIME * 20))" ]; then break; fi
done
"""

ENDPOINT = "10.77.0.1:29400"


class Node:
    """One cddprun on one host of the cluster, its stderr in a file."""

    def __init__(self, background, cluster, i, tmp, args, env=None, script=None):
        self.i = i
        self.log = tmp / f"agent-{i}.{len(list(tmp.glob(f'agent-{i}.*')))}.log"
        e = dict(os.environ, NODE=str(i), OUT=str(tmp / "out"), LOGLEVEL="INFO",
                 TORCH_ELASTIC_SHUTDOWN_TIMEOUT="2")
        for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "CDDP_NO_IFNAME", "PET_NO_IFNAME"):
            e.pop(k, None)
        e.update(env or {})
        cmd = cluster.prefix(i) + [binary("cddprun"), *args, str(script or tmp / "worker.sh")]
        with open(self.log, "w") as fh:
            self.bg = background(cmd, env=e, stdout=fh, stderr=fh)

    def text(self):
        return self.log.read_text(errors="replace")

    def wait(self, timeout=60):
        try:
            return self.bg.proc.wait(timeout=timeout)
        except Exception:
            self.bg.kill()
            pytest.fail(f"node {self.i} did not exit within {timeout}s:\n{self.text()[-3000:]}")

    def running(self):
        return self.bg.proc.poll() is None


@pytest.fixture
def job(background, tmp_path, netns_cluster):
    """job(n) -> (cluster, start(i, *args, **kw) -> Node, out dir)."""
    out = tmp_path / "out"
    out.mkdir()
    w = tmp_path / "worker.sh"
    w.write_text(WORKER)
    w.chmod(0o755)
    nodes = []

    def make(n):
        c = netns_cluster(n)

        def start(i, *args, **kw):
            node = Node(background, c, i, tmp_path, args, **kw)
            nodes.append(node)
            return node
        return c, start, out

    yield make
    for n in nodes:
        if n.running():
            n.bg.kill()
        for mark in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            assert mark not in n.text(), f"node {n.i}: {mark}\n{n.text()[-3000:]}"


def c10d(nnodes, nproc=2, conf=None, run_id="ns"):
    args = [f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={ENDPOINT}", f"--rdzv_id={run_id}"]
    if conf:
        args.append(f"--rdzv_conf={conf}")
    return args


def starts(out, ignore=()):
    """Every worker start so far (but those in ignore): dicts of what it got."""
    found = []
    for f in sorted(pathlib.Path(out).glob("w.*.env")):
        if f.name in ignore:
            continue
        d = dict(line.partition("=")[::2] for line in f.read_text().splitlines())
        d["file"] = f.name
        found.append(d)
    return found


def snapshot(out):
    return {f.name for f in pathlib.Path(out).glob("w.*.env")}


def wait_world(out, world, timeout=60, ignore=()):
    """The starts of one round (MASTER_PORT) of world size `world`, once all
    its workers have started."""
    def done():
        by = {}
        for e in starts(out, ignore):
            by.setdefault(e["MASTER_PORT"], []).append(e)
        for r in by.values():
            if len(r) == world and all(e["WORLD_SIZE"] == str(world) for e in r):
                return r
        return None
    return wait_for(done, timeout=timeout, what=f"a round of world size {world} in {out}")


def figure(what, seconds):
    print(f"netns figure: {what}: {seconds:.2f} s")


def status_of(cluster, i, port):
    code = ("import urllib.request,sys;"
            f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{port}/status',"
            "timeout=5).read().decode())")
    r = cluster.run(i, "/usr/bin/python3", "-c", code)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_interface_chosen_published_and_overridable(job):
    """2 hosts x 2 workers: eth0 chosen on both, MASTER_ADDR host0's eth0
    address, /status shows the choice; a user's variable wins on its host;
    --no_ifname and CDDP_NO_IFNAME leave the variables alone."""
    c, start, out = job(2)
    nodes = [start(i, *c10d(2), "--status_port=8080", env={"LIFETIME": "30"}) for i in range(2)]
    r = wait_world(out, 4)
    assert {e["GLOO_SOCKET_IFNAME"] for e in r} == {"eth0"}
    assert {e["NCCL_SOCKET_IFNAME"] for e in r} == {"eth0"}
    assert {e["MASTER_ADDR"] for e in r} == {c.hosts[0].addr}
    assert {e["HOST"] for e in r} == {"host0", "host1"}
    for i, n in enumerate(nodes):
        assert f"A2101: network interface eth0 ({c.hosts[i].addr})" in n.text()
        st = wait_for(lambda: status_of(c, i, 8080), what="/status")
        assert st["network"] == {"ifname": "eth0", "address": c.hosts[i].addr, "source": "auto"}
    (out / "finish").touch()
    for n in nodes:
        assert n.wait() == 0, n.text()[-3000:]

    # The user's setting wins (host 1 only); off on host 0 (flag), host 1 (variable).
    (out / "finish").unlink()
    before = snapshot(out)
    nodes = [start(0, *c10d(2, run_id="ns2"), "--no_ifname", env={"LIFETIME": "30"}),
             start(1, *c10d(2, run_id="ns2"), env={"LIFETIME": "30", "GLOO_SOCKET_IFNAME": "lo"})]
    r = wait_world(out, 4, ignore=before)
    by_node = {e["NODE"]: e for e in r}
    assert "GLOO_SOCKET_IFNAME" not in by_node["0"] and "NCCL_SOCKET_IFNAME" not in by_node["0"]
    assert by_node["1"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert by_node["1"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert "interface choice is off (--no_ifname)" in nodes[0].text()
    assert "GLOO_SOCKET_IFNAME is the user's" in nodes[1].text()
    (out / "finish").touch()
    for n in nodes:
        assert n.wait() == 0, n.text()[-3000:]
    (out / "finish").unlink()
    before = snapshot(out)
    nodes = [start(i, *c10d(2, run_id="ns3"), env={"LIFETIME": "30", "CDDP_NO_IFNAME": "1"})
             for i in range(2)]
    r = wait_world(out, 4, ignore=before)
    assert all("GLOO_SOCKET_IFNAME" not in e for e in r)
    (out / "finish").touch()
    for n in nodes:
        assert n.wait() == 0, n.text()[-3000:]


SMALL = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
         "10", "--epochs", "1", "--log-every", "1", "--threads", "1"]


@pytest.mark.heavy
def test_cddp_train_across_hosts(job, tmp_path):
    """cddp-train, 2 hosts x 2 ranks, gloo between the hosts: every rank ends
    with the same weights."""
    c, start, out = job(2)
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/sh\nexec {binary('cddp-train')} {' '.join(SMALL)} "
                      "--num-samples 32 --batch-size 4 --steps 3\n")
    script.chmod(0o755)
    nodes = [start(i, *c10d(2), script=script, env={"LOGLEVEL": "DEBUG"}) for i in range(2)]
    for n in nodes:
        assert n.wait(timeout=240) == 0, n.text()[-3000:]
    text = "".join(n.text() for n in nodes)
    sums = dict(re.findall(r"rank(\d+) \S+ \w+ T6202: after \d+ steps: state checksum (\w+)",
                           text))
    assert sorted(sums) == ["0", "1", "2", "3"], text[-3000:]
    assert len(set(sums.values())) == 1, sums
    assert "binding eth0" in text  # gloo bound the chosen interface


@pytest.mark.heavy
def test_seed_ddp_script_across_hosts(job, tmp_path, torch_python):
    """The seed's DDP script (torch, gloo, init_method env://), 2 hosts x 2
    ranks, no GLOO_SOCKET_IFNAME from the user: it trains and every rank
    ends with the same weights (the script checks; rank 0 writes the
    result)."""
    c, start, out = job(2)
    res = tmp_path / "res"
    res.mkdir()
    script = tmp_path / "seed.sh"
    script.write_text(f"#!/bin/sh\nexec {torch_python} {ROOT / 'tests' / 'compat' / 'ddp_train.py'}"
                      f" --out {res} --epochs 1\n")
    script.chmod(0o755)
    # As torchrun: without an interface gloo falls back to loopback and fails.
    off = [start(i, *c10d(2, run_id="off"), script=script, env={"CDDP_NO_IFNAME": "1"})
           for i in range(2)]
    for n in off:
        assert n.wait(timeout=240) == 1, n.text()[-3000:]
    assert "Unable to resolve hostname" in off[0].text() + off[1].text()
    nodes = [start(i, *c10d(2), script=script) for i in range(2)]
    for n in nodes:
        assert n.wait(timeout=240) == 0, n.text()[-3000:]
    result = json.loads((res / "result.json").read_text())
    assert result["env"]["WORLD_SIZE"] == "4"


WINDOW_CONF = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5," \
              "join_timeout=60"
WINDOW = 2.0  # keep_alive_interval x keep_alive_max_attempt


def worker_pids(rnd, node):
    return [int(e["PID"]) for e in rnd if e["NODE"] == str(node)]


@pytest.mark.heavy
@pytest.mark.parametrize("nnodes", ["2:3", "3"], ids=["elastic", "fixed"])
def test_partition_longer_than_window_then_heal(job, nnodes):
    """3 hosts x 2 workers; host 2's link goes down for 3 windows: its
    workers stop within about the window; the others restart without it
    (elastic: a round of 4) or wait for it (fixed: their workers stop, no
    round); when the link comes back it joins again as a new member and the
    job finishes at full size (6 workers), every agent exiting 0."""
    c, start, out = job(3)
    nodes = [start(i, *c10d(nnodes, conf=WINDOW_CONF)) for i in range(3)]
    first = wait_world(out, 6)
    before = snapshot(out)
    victims = worker_pids(first, 2)
    others = worker_pids(first, 0) + worker_pids(first, 1)
    t0, w0 = time.monotonic(), time.time()
    c.partition(2)
    try:
        wait_for(lambda: not any(alive(p) for p in victims), timeout=WINDOW * 4,
                 what="the partitioned host's workers to stop")
        t_stop = time.monotonic() - t0
        figure(f"partition ({nnodes}): the cut-off host's workers stopped after", t_stop)
        assert t_stop >= WINDOW * 0.5, "stopped before the window could have passed"
        assert "heard nothing from the rendezvous server" in nodes[2].text()
        if nnodes == "2:3":
            second = wait_world(out, 4, ignore=before, timeout=WINDOW * 6)
            assert {e["NODE"] for e in second} == {"0", "1"}
            figure("partition (2:3): the survivors' round of 4 started after",
                   max(float(e["T"]) for e in second) - w0)
        else:
            wait_for(lambda: not any(alive(p) for p in others), timeout=WINDOW * 6,
                     what="the survivors' workers to stop (node lost)")
        rest = WINDOW * 3 - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)
    finally:
        c.heal(2)
    after = snapshot(out)
    w1 = time.time()
    full = wait_world(out, 6, ignore=after, timeout=60)
    figure(f"partition ({nnodes}): healed; the full round of 6 started after",
           max(float(e["T"]) for e in full) - w1)
    assert {e["NODE"] for e in full} == {"0", "1", "2"}
    assert "again as a new member" in nodes[2].text()
    (out / "finish").touch()
    for n in nodes:
        assert n.wait() == 0, n.text()[-3000:]


@pytest.mark.heavy
def test_blip_shorter_than_window_restarts_nothing(job):
    """A link down for a third of the window: no worker stops or starts on
    any host, nobody logs a restart."""
    conf = "keep_alive_interval=0.5,keep_alive_max_attempt=6,last_call_timeout=0.5"
    c, start, out = job(2)
    nodes = [start(i, *c10d("1:2", conf=conf)) for i in range(2)]
    first = wait_world(out, 4)
    before = snapshot(out)
    c.partition(1)
    try:
        time.sleep(1.0)
    finally:
        c.heal(1)
    time.sleep(3 * 3.0)  # three windows: anything that would happen has
    assert snapshot(out) == before
    assert all(alive(int(e["PID"])) for e in first)
    for n in nodes:
        assert "will restart worker group" not in n.text(), n.text()[-2000:]
        assert "heard nothing" not in n.text()
    (out / "finish").touch()
    for n in nodes:
        assert n.wait() == 0, n.text()[-3000:]


@pytest.mark.heavy
def test_latency_and_loss_on_every_link(job):
    """tc netem delay 50ms loss 1% on every host's link (about 100 ms each
    way between two hosts): the round forms, the job completes, no restarts."""
    c, start, out = job(3)
    c.netem("delay 50ms loss 1%")
    t0 = time.monotonic()
    nodes = [start(i, *c10d(3, conf="keep_alive_interval=0.5,keep_alive_max_attempt=6"),
                   env={"LIFETIME": "5"}) for i in range(3)]
    wait_world(out, 6)
    figure("netem 50ms/1%: the first round of 3 hosts started after", time.monotonic() - t0)
    for n in nodes:
        assert n.wait(timeout=90) == 0, n.text()[-3000:]
    assert len(starts(out)) == 6
    for n in nodes:
        assert "will restart worker group" not in n.text(), n.text()[-2000:]


SINK = ("import socket,sys\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); print('ready', flush=True)\n"
        "c, _ = s.accept(); n = 0\n"
        "while True:\n"
        "    d = c.recv(65536)\n"
        "    if not d: break\n"
        "    n += len(d)\n"
        "print(n, flush=True)\n")


def bulk(cluster, background, src, dst, nbytes, port=5999):
    """Sends nbytes from host src to host dst over TCP; the bytes received."""
    sink = background(cluster.prefix(dst) + ["/usr/bin/python3", "-c", SINK, str(port)])
    assert sink.proc.stdout.readline().strip() == "ready"
    r = cluster.run(src, "/usr/bin/python3", "-c",
                    "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])));"
                    "s.sendall(b'x' * int(sys.argv[3])); s.close()",
                    cluster.hosts[dst].addr, port, nbytes, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sink.wait(timeout=60) == 0
    return int(sink.out.split()[0])


def test_loss_and_rate_limit_on_every_link(job, background):
    """What this kernel has instead of netem (no sch_netem): nftables drops
    1% of the packets into and out of every host's eth0 (about 2% between
    two hosts), and tc tbf holds what each host sends to 10 mbit/s. A bulk
    transfer shows both bite (packets dropped, the bucket over its limit)
    and TCP still delivers every byte; then 3 hosts form their round and
    finish, with no restart and nobody removed."""
    c, start, out = job(3)
    c.loss(1)
    c.rate("10mbit")
    assert bulk(c, background, 1, 0, 1_000_000) == 1_000_000
    assert c.dropped(0) + c.dropped(1) > 0, "the loss rules dropped nothing"
    assert c.qdisc_stats(1)["overlimits"] > 0, c.qdisc_stats(1)
    t0 = time.monotonic()
    nodes = [start(i, *c10d(3, conf="keep_alive_interval=0.5,keep_alive_max_attempt=6"),
                   env={"LIFETIME": "5"}) for i in range(3)]
    wait_world(out, 6)
    figure("1% loss per host, 10 mbit/s: the first round of 3 hosts started after",
           time.monotonic() - t0)
    for n in nodes:
        assert n.wait(timeout=90) == 0, n.text()[-3000:]
    assert len(starts(out)) == 6
    for n in nodes:
        assert "will restart worker group" not in n.text(), n.text()[-2000:]
        assert "heard nothing" not in n.text() and "removed" not in n.text(), n.text()[-2000:]
    print(f"netns figure: packets dropped by the loss rules: {sum(c.dropped(i) for i in range(3))}")


@pytest.mark.heavy
def test_cddp_train_under_loss_and_a_rate_limit_is_bit_exact(job, tmp_path):
    """cddp-train, 2 hosts x 1 rank: with 2% loss per host and 200 mbit/s
    on every link the gradients arrive late but whole: the same state
    checksum as the same run on clean links."""
    c, start, out = job(2)
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/sh\nexec {binary('cddp-train')} {' '.join(SMALL)} "
                      "--num-samples 16 --batch-size 4 --steps 2\n")
    script.chmod(0o755)

    def checksum(run_id):
        nodes = [start(i, *c10d(2, nproc=1, run_id=run_id), script=script) for i in range(2)]
        for n in nodes:
            assert n.wait(timeout=300) == 0, n.text()[-3000:]
        text = "".join(n.text() for n in nodes[-2:])
        sums = set(re.findall(r"T6202: after 2 steps: state checksum (\w+)", text))
        assert len(sums) == 1, text[-3000:]
        return sums.pop()
    clean = checksum("clean")
    c.loss(2)
    c.rate("200mbit", burst="256kb")
    t0 = time.monotonic()
    assert checksum("lossy") == clean
    figure("cddp-train, 2 steps under 2% loss and 200 mbit/s", time.monotonic() - t0)
    assert c.dropped(0) + c.dropped(1) > 0


@pytest.mark.heavy
def test_host_crash_survivors_go_on(job):
    """Host 2 crashes (all its processes SIGKILLed, its link cut): hosts 0
    and 1 form a round of 4 without it and finish."""
    c, start, out = job(3)
    nodes = [start(i, *c10d("2:3", conf=WINDOW_CONF)) for i in range(3)]
    wait_world(out, 6)
    before = snapshot(out)
    t0 = time.monotonic()
    c.crash(2)
    second = wait_world(out, 4, ignore=before, timeout=WINDOW * 8)
    figure("host crash: the survivors' round of 4 started after", time.monotonic() - t0)
    assert {e["NODE"] for e in second} == {"0", "1"}
    assert "no heartbeat" in nodes[0].text() + nodes[1].text()
    (out / "finish").touch()
    for n in nodes[:2]:
        assert n.wait() == 0, n.text()[-3000:]
    assert not nodes[2].running()


TRAIN = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
         "10", "--epochs", "4", "--log-every", "1", "--threads", "1", "--num-samples", "32",
         "--batch-size", "4"]


@pytest.mark.heavy
def test_spare_host_takes_a_lost_hosts_place_in_place(job, tmp_path):
    """--restart_scope=worker, --nnodes=2 with a third host on the wait list
    (a spare): host 1's agent and workers are SIGKILLed mid-run; host 2
    takes its place (global ranks 2 and 3, generation 1) and its workers
    take the state from host 0's, which keep their processes; the run ends
    on the checksum of a run without the fault (docs/multi-node.md,
    "Replacing a node in place")."""
    c, start, out = job(3)
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/sh\nexec {binary('cddp-train')} {' '.join(TRAIN)} $EXTRA\n")
    script.chmod(0o755)

    def sums(text):
        return dict(re.findall(r"rank(\d+) \S+ \w+ T6202: after 8 steps: state checksum (\w+)",
                               text))
    ref = [start(i, *c10d(2, run_id="ref"), script=script) for i in range(2)]
    for n in ref:
        assert n.wait(timeout=240) == 0, n.text()[-3000:]
    want = sums("".join(n.text() for n in ref))
    assert sorted(want) == ["0", "1", "2", "3"] and len(set(want.values())) == 1, want

    # Every step slowed by 200 ms (a sleep: the state is the same), so
    # that host 1 dies mid-run.
    args = [*c10d(2, run_id="spare"), "--restart_scope=worker", "--max_restarts=1"]
    env = {"LOGLEVEL": "DEBUG", "EXTRA": "--fault slow@step=0,ms=200,for=8"}
    # host 0's /status stays up after the run (--status_linger) to be read
    nodes = [start(0, *args, "--status_port=8080", "--status_linger=60", script=script, env=env),
             start(1, *args, script=script, env=env)]
    for n in nodes:
        wait_for(lambda: "A0102" in n.text(), timeout=120, what=f"node {n.i}'s round")
    nodes.append(start(2, *args, script=script, env=env))
    wait_for(lambda: "A0701" in nodes[2].text(), timeout=60, what="host 2 on the wait list")
    wait_for(lambda: nodes[1].text().count("T0002") >= 2, timeout=120, what="host 1's steps")
    t0 = time.monotonic()
    c.kill(1)
    assert nodes[2].wait(timeout=240) == 0, nodes[2].text()[-5000:]
    figure("spare host in place: from the kill to the end of the run", time.monotonic() - t0)
    st = wait_for(lambda: (lambda s: s if s["state"] == "succeeded" else None)(
        status_of(c, 0, 8080)), timeout=60, interval=0.5, what="host 0's /status: succeeded")
    nodes[0].bg.proc.send_signal(signal.SIGTERM)  # ends the linger; the exit stays the run's
    assert nodes[0].wait() == 0, nodes[0].text()[-5000:]
    assert st["restarts"]["node_replacements"] == 1 and st["restarts"]["generation"] == 1, st
    assert st["restarts"]["by_scope"] == {"worker": 0, "group": 0}, st
    assert st["restarts"]["count"] == 0 and [w["restarts"] for w in st["workers"]] == [0, 0], st
    t0_text, t2_text = nodes[0].text(), nodes[2].text()
    assert sums(t0_text + t2_text) == want, (t0_text + t2_text)[-5000:]
    # host 0: one start of its workers, the same processes at the end
    assert t0_text.count("A0207") == 1 and "A0232" in t0_text, t0_text[-5000:]
    assert "A0230" in t0_text and "generation 1, ranks 2,3" in t0_text, t0_text[-5000:]
    pid = r"cddp-train\[(\d+)\] rank(\d) \S+ \w+ {}:"
    before = {r: p for p, r in re.findall(pid.format("T6201"), t0_text)}
    after = {r: p for p, r in re.findall(pid.format("T6202"), t0_text)}
    assert sorted(before) == ["0", "1"] and before == after, (before, after)
    # host 2: ranks 2 and 3 in generation 1, the state from rank 0
    assert "A0231" in t2_text and "ranks 2,3, generation 1" in t2_text, t2_text[-5000:]
    text = t0_text + t2_text
    assert len(re.findall(r"T6212: generation 1: state from rank 0", text)) == 4, text[-5000:]
    # another host (its own host name): over the network, not a memory read
    assert text.count("0 ranks read them from a peer's memory on their host, 2 took them over "
                      "the network") == 4, text[-5000:]


# Counts itself on the agent store (1: the first worker to use this
# store), and runs until $OUT/finish exists.
STORE_WORKER = r"""
import datetime, os, time
import torch.distributed as dist
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                  timeout=datetime.timedelta(seconds=30))
n = s.add("workers", 1)
print("START rank=%s world=%s count=%d port=%s gen=%s" % (
    os.environ["RANK"], os.environ["WORLD_SIZE"], n, os.environ["MASTER_PORT"],
    os.environ["CDDP_GENERATION"]), flush=True)
while not os.path.exists(os.path.join(os.environ["OUT"], "finish")):
    time.sleep(0.05)
"""


@pytest.mark.heavy
def test_lost_host_without_a_spare_restarts_the_group(job, tmp_path, torch_python):
    """--restart_scope=worker, --nnodes=1:2, no spare: host 1 is SIGKILLed;
    host 0 joins with its workers running (A0232), the round of one node
    does not go on in place (A0233): its workers restart in a new group,
    on a fresh agent store at the same port."""
    c, start, out = job(2)
    py = tmp_path / "store_worker.py"
    py.write_text(STORE_WORKER)
    script = tmp_path / "store_worker.sh"
    script.write_text(f"#!/bin/sh\nexec {TORCH_PY} {py}\n")
    script.chmod(0o755)
    args = [*c10d("1:2", nproc=1, conf="last_call_timeout=0.5"), "--restart_scope=worker"]
    nodes = [start(i, *args, script=script) for i in range(2)]
    starts = r"START rank=(\d) world=(\d) count=(\d) port=(\d+) gen=(\d+)"
    wait_for(lambda: len(re.findall(starts, nodes[0].text() + nodes[1].text())) == 2,
             timeout=60, what="both workers started")
    c.kill(1)
    wait_for(lambda: len(re.findall(starts, nodes[0].text())) == 2, timeout=60,
             what="host 0's workers started again")
    (out / "finish").touch()
    assert nodes[0].wait() == 0, nodes[0].text()[-3000:]
    text = nodes[0].text()
    assert "A0232" in text and "A0233" in text and "A0230" not in text, text[-3000:]
    first, second = re.findall(starts, text)
    assert first[:2] == ("0", "2") and second[:2] == ("0", "1"), (first, second)
    # the same port, a fresh store (the first to count); a new group: generation 0
    assert second[2] == "1" and second[3] == first[3] and second[4] == "0", (first, second)


@pytest.mark.heavy
def test_server_down_but_host_up_is_not_a_partition(job, background):
    """cddp-rdzv on host 0 SIGKILLed for three keep-alive windows: host 0
    refuses the agents' reconnects, so they know the server is gone (not
    removing anyone) and their workers run on all the while; started again,
    the job goes on and finishes."""
    c, start, out = job(3)

    def rdzv():
        d = background(c.prefix(0) + [binary("cddp-rdzv"), "--host", "0.0.0.0", "--port",
                                      "29400"], stderr=subprocess.DEVNULL)
        assert "listening on" in d.proc.stdout.readline()
        return d
    d = rdzv()
    conf = "is_host=0,keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=0.5"
    nodes = [start(i, *c10d(2, conf=conf)) for i in (1, 2)]
    first = wait_world(out, 4)
    os.kill(d.pid, signal.SIGKILL)
    d.proc.wait(timeout=10)
    for n in nodes:
        wait_for(lambda: "reconnecting" in n.text(), what="the agents to notice")
    time.sleep(3 * 1.0)
    assert all(alive(int(e["PID"])) for e in first), "the workers run on while host 0 refuses"
    for n in nodes:
        assert "heard nothing" not in n.text(), n.text()[-2000:]
    rdzv()
    for n in nodes:
        wait_for(lambda: "reconnected" in n.text() or "ended while it was disconnected" in n.text(),
                 timeout=30, what="the agents to reconnect")
    time.sleep(1.0)
    (out / "finish").touch()
    for n in nodes:
        assert n.wait() == 0, n.text()[-3000:]
