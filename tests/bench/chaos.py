#!/usr/bin/env python3
"""A chaos run: three hosts train with faults injected one at a time, and
nothing is lost (issue 28, item 11).

    /usr/bin/python3 tests/bench/chaos.py [--build build] [--seed S] [--faults N]
                                          [--backend hosted,rdzv,etcd] [--nproc 1]

The cluster is three network namespaces on a bridge (tests/netns.py). Each
host runs one cddprun (`--nnodes=2:3`, `--max_restarts=1000`,
`--watchdog_timeout=5`) whose workers are cddp-train (ResNet-18 on small
synthetic images, one thread each, `--checkpoint` on a tmpfs every host
sees, written every 4 steps). The rendezvous is one of:

  hosted  c10d, served by host 0's agent (`is_host=1`);
  rdzv    c10d, served by cddp-rdzv on host 0;
  etcd    etcd-v3 over a three-member etcd cluster, one member per host.

A seeded random schedule then injects faults one at a time, each once the
job trains again past where it stood before the previous one:

  worker_kill    SIGKILL one worker
  worker_stop    SIGSTOP one worker (the progress watchdog finds it)
  agent_kill     SIGKILL one agent (a hosting one too), start it again 1 s later
  partition      cut one host's link for 20 s (--partition), then heal it
  lossy          2% loss per direction and 400 mbit/s on one host's link for 20 s
                 (nftables random drop, tc tbf: the kernel has no sch_netem)
  rdzv_restart   SIGKILL cddp-rdzv, start it again on its port 1 s later (rdzv)
  etcd_kill      SIGKILL one etcd member, start it again 3 s later (etcd)
  disk_full      fill the checkpoint tmpfs (its files pinned by hard links: a
                 write deletes the old PATH.prev first, so a full disk alone
                 still takes it); free it once a write has failed
  ckpt_corrupt   right after a checkpoint lands, overwrite 4 KiB in its middle
                 and SIGKILL a worker: the restart finds the damage (CRC-32)
                 and resumes from the checkpoint before it (PATH.prev)

At the end it checks, and prints as a table:

  - the state checksum every rank logs (T6202) equals that of a fault-free
    run of the same world size (cddprun --standalone, 3 workers x nproc).
    That needs every step to run at that world size (the sampler's order
    depends on it). A lost node does make the others form a round of two
    at once (cddp does not wait out last call after a restart), but the
    run is one epoch long, so every checkpoint is a position inside an
    epoch, which cddp-train refuses to resume at another world size (exit
    1, one line): such rounds train nothing (they are counted and
    reported). Every step line is checked too: its epoch has the number
    of batches of world size 3;
  - every agent still running exits 0; after they have, only the daemons'
    ports listen (cddp-rdzv's, etcd's), and after those stop no process is
    left in any namespace and no listening socket anywhere (no orphan, no
    leaked port);
  - per fault: when it was detected (the first log line that reacts to
    it), when the job trained again (the first step of the restarted
    workers; "-" where none restarted), when it was back at the step it
    had reached, the longest time without a step, and how many steps were
    done again;
  - no sanitizer report in any log (an ASan build).

Detection markers: worker_kill A0503 (the worker's exit), worker_stop A0901
(the watchdog), agent_kill A0402/A0103/A0715/A2011/R0023 on another
host, partition and lossy A2110/R0023/A0103/A0402/A0715/A2015/A0901/A0503
(whichever comes first), rdzv_restart A0715, etcd_kill A2008/A2015/A2005,
disk_full the trainer's "No space left on device", ckpt_corrupt T0506.

The same function, run_chaos(), is what tests/integration/test_chaos.py
runs (a short schedule in the suite, a long one marked heavy). Needs root
(network namespaces, mount, nft, tc). Figures, never pass/fail on time:
the exit status is 0 when every check above held, 1 otherwise.
"""
import argparse
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import netns  # noqa: E402  (tests/netns.py: the cluster)

ETCD = "/usr/bin/etcd"
RDZV_PORT = 29400
CKPT_EVERY = 4
WATCHDOG = 5  # s: --watchdog_timeout
WINDOW = "keep_alive_interval=0.5,keep_alive_max_attempt=4"  # 2 s
# A long last call: the first round waits for all three hosts (a round of
# two before the first checkpoint would train at world size 2). Later
# rounds do not wait for it: after a restart cddp completes a round as soon
# as the members still alive are back.
CONF = WINDOW + ",last_call_timeout=40,join_timeout=300"
BACKENDS = ("hosted", "rdzv", "etcd")
LOSSY = (2, "400mbit")  # loss per direction (%), tbf rate: slower steps, below the watchdog

# fault -> backends it applies to
FAULTS = {
    "worker_kill": BACKENDS,
    "worker_stop": BACKENDS,
    "agent_kill": BACKENDS,
    "partition": BACKENDS,
    "lossy": BACKENDS,
    "rdzv_restart": ("rdzv",),
    "etcd_kill": ("etcd",),
    "disk_full": BACKENDS,
    "ckpt_corrupt": BACKENDS,
}

MARKERS = {
    "worker_kill": r"A0503",
    "worker_stop": r"A0901",
    # (A0503: a survivor's worker exits 75 because the dead agent's workers
    # died with it; over etcd-v3 that can restart the job before the lease
    # runs out, so no rendezvous line is the first to react)
    "agent_kill": r"A0402|A0103|A0715|A2011|R0023|A0503",
    "partition": r"A2110|R0023|A0103|A0402|A0715|A2015|A0901|A0503",
    "lossy": r"A2110|R0023|A0103|A0402|A0715|A2015|A0901|A0503",
    "rdzv_restart": r"A0715",
    "etcd_kill": r"A2008|A2015|A2005",
    "disk_full": r"No space left on device",
    "ckpt_corrupt": r"T0506",
}

STEP_RE = re.compile(r"^Epoch (\d+) \[(\d+)/(\d+)\] Loss")
RESUME_RE = re.compile(r"^=> resumed from checkpoint '([^']*)' \(epoch \d+, batch \d+, step (\d+)\)")
SUM_RE = re.compile(r"rank(\d+) \S+ \w+ T6202: after (\d+) steps: state checksum (\w+)")
ROUND_RE = re.compile(r"A0102: .*round (\d+), .*world_size=(\d+) .*restart_count=(\d+)")


class ChaosError(Exception):
    pass


class Journal:
    """Every line every process of the run printed, with the monotonic time
    it was read, in one list (the taps append from their threads)."""

    def __init__(self, logdir):
        self.lines = []  # (t, source, text)
        self.lock = threading.Lock()
        self.logdir = logdir

    def tap(self, source, stream):
        """Reads stream line by line on a thread of its own until it ends."""
        def run():
            with open(self.logdir / f"{source}.log", "a", errors="replace") as fh:
                for line in stream:
                    t = time.monotonic()
                    line = line.rstrip("\n")
                    with self.lock:
                        self.lines.append((t, source, line))
                    fh.write(f"{t:.3f} {line}\n")
                    fh.flush()
        th = threading.Thread(target=run, daemon=True)
        th.start()
        return th

    def snapshot(self):
        with self.lock:
            return list(self.lines)

    def find(self, pattern, after=0.0, before=float("inf"), sources=None):
        rx = re.compile(pattern)
        out = []
        for t, src, text in self.snapshot():
            if after <= t < before and (sources is None or src in sources):
                m = rx.search(text)
                if m:
                    out.append((t, src, m))
        return out

    def first(self, pattern, after=0.0, sources=None):
        hits = self.find(pattern, after, sources=sources)
        return hits[0] if hits else None

    def steps(self, after=0.0, before=float("inf")):
        """(t, completed steps) of every step line (rank 0 prints them)."""
        out = []
        for t, _, m in self.find(STEP_RE.pattern, after, before):
            e, b, n = (int(x) for x in m.groups())
            out.append((t, e * n + b + 1))
        return out

    def high_water(self, before=float("inf")):
        s = self.steps(before=before)
        return max((k for _, k in s), default=0)

    def tail(self, n=60):
        return "\n".join(f"{t:.3f} {src}: {text}" for t, src, text in self.snapshot()[-n:])


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise ChaosError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def running(pid):
    return netns.running(pid)


class Job:
    """One backend's run on a fresh cluster: its processes, its faults."""

    def __init__(self, build, backend, work, steps, nproc, rng, tag, partition_s):
        self.build = build
        self.backend = backend
        self.work = work
        self.steps = steps
        self.nproc = nproc
        self.rng = rng
        self.tag = tag
        self.partition_s = partition_s
        self.journal = Journal(work)
        self.agents = {}  # host -> Popen (the current one)
        self.agent_starts = {0: 0, 1: 0, 2: 0}
        self.rdzv = None
        self.rdzv_starts = 0
        self.etcd = {}  # host -> Popen
        self.ckdir = work / "ckpt"
        self.ckpt = self.ckdir / "ck.safetensors"
        self.cluster = None
        self.mounted = False
        self.procs = []  # everything started, for the teardown

    # ---- set-up
    def env(self):
        e = dict(os.environ, LOGLEVEL="INFO", CDDP_TEST_TAG=self.tag,
                 TORCH_ELASTIC_SHUTDOWN_TIMEOUT="2", OMP_NUM_THREADS="1")
        for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "CDDP_NO_IFNAME", "PET_NO_IFNAME"):
            e.pop(k, None)
        return e

    def spawn(self, host, argv, source):
        p = subprocess.Popen(self.cluster.prefix(host) + [str(a) for a in argv],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", env=self.env(), start_new_session=True)
        self.procs.append(p)
        self.journal.tap(source, p.stdout)
        return p

    def endpoint(self):
        if self.backend == "etcd":
            return ",".join(f"{h.addr}:2379" for h in self.cluster.hosts)
        return f"{self.cluster.hosts[0].addr}:{RDZV_PORT}"

    def trainer_args(self):
        return trainer_args(self.steps, self.ckpt, 3 * self.nproc)

    def start_agent(self, i):
        conf = CONF
        if self.backend == "hosted":
            conf += ",is_host=1" if i == 0 else ",is_host=0"
        elif self.backend == "rdzv":
            conf += ",is_host=0"
        argv = [self.build / "launcher" / "cddprun", "--nnodes=2:3",
                f"--nproc_per_node={self.nproc}",
                "--rdzv_backend=" + ("etcd-v3" if self.backend == "etcd" else "c10d"),
                f"--rdzv_endpoint={self.endpoint()}", "--rdzv_id=chaos", f"--rdzv_conf={conf}",
                "--max_restarts=1000", f"--watchdog_timeout={WATCHDOG}", "--no-python",
                self.build / "trainer" / "cddp-train", *self.trainer_args()]
        self.agent_starts[i] += 1
        self.agents[i] = self.spawn(i, argv, f"agent{i}.{self.agent_starts[i]}")
        return self.agents[i]

    def start_rdzv(self):
        self.rdzv_starts += 1
        source = f"rdzv.{self.rdzv_starts}"
        self.rdzv = self.spawn(0, [self.build / "rendezvous" / "cddp-rdzv", "--host", "0.0.0.0",
                                   "--port", RDZV_PORT], source)
        wait_until(lambda: self.journal.first(r"listening on", sources={source}), 20,
                   "cddp-rdzv to listen")

    def etcd_argv(self, i):
        h = self.cluster.hosts[i]
        peers = ",".join(f"m{k}=http://{x.addr}:2380" for k, x in enumerate(self.cluster.hosts))
        return [ETCD, "--name", f"m{i}", "--data-dir", self.work / f"etcd{i}",
                "--listen-client-urls", f"http://{h.addr}:2379",
                "--advertise-client-urls", f"http://{h.addr}:2379",
                "--listen-peer-urls", f"http://{h.addr}:2380",
                "--initial-advertise-peer-urls", f"http://{h.addr}:2380",
                "--initial-cluster", peers, "--initial-cluster-token", "cddp-chaos",
                "--initial-cluster-state", "new", "--log-level", "warn", "--log-outputs", "stderr"]

    def start_etcd(self, i):
        k = len(list(self.work.glob(f"etcd{i}.*.log"))) + 1
        self.etcd[i] = self.spawn(i, self.etcd_argv(i), f"etcd{i}.{k}")

    def etcd_healthy(self, i):
        h = self.cluster.hosts[i]
        code = ("import json,sys,urllib.request;"
                f"r=urllib.request.urlopen('http://{h.addr}:2379/health',timeout=2);"
                "sys.exit(0 if json.load(r).get('health')=='true' else 1)")
        try:
            return self.cluster.run(i, "/usr/bin/python3", "-c", code, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def setup(self):
        self.cluster = netns.Cluster(3)
        self.ckdir.mkdir()
        # The checkpoint disk: a tmpfs every host sees (the hosts share the
        # root's mounts), room for the two checkpoints a run keeps (2 x 90
        # MB) and some to spare, so that disk_full can fill it.
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320m,mode=0755", "cddp-chaos",
                            str(self.ckdir)], capture_output=True, text=True)
        if r.returncode != 0:
            raise ChaosError(f"mount tmpfs: {r.stderr.strip()}")
        self.mounted = True
        if self.backend == "rdzv":
            self.start_rdzv()
        if self.backend == "etcd":
            for i in range(3):
                self.start_etcd(i)
            wait_until(lambda: all(self.etcd_healthy(i) for i in range(3)), 60,
                       "etcd to be healthy")
        for i in range(3):
            self.start_agent(i)

    def teardown(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.cluster is not None:
            self.cluster.close()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.ckdir)], capture_output=True)
            self.mounted = False

    # ---- what is running
    def workers(self, i=None):
        hosts = range(3) if i is None else [i]
        return [(h, p) for h in hosts for p in self.cluster.pids(h) if comm(p) == "cddp-train"
                and running(p)]

    def live_agents(self):
        return [i for i, p in self.agents.items() if p.poll() is None]

    # ---- faults; each returns (target, t_inject, t_end) where t_end is
    # when the fault itself was over (healed, restarted, freed)
    def pick_worker(self):
        w = wait_until(self.workers, 60, "a running worker")
        return self.rng.choice(sorted(w))

    def f_worker_kill(self):
        h, pid = self.pick_worker()
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        return f"host{h} pid {pid}", t, t

    def f_worker_stop(self):
        h, pid = self.pick_worker()
        t = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        return f"host{h} pid {pid}", t, t

    def f_agent_kill(self):
        i = self.rng.randrange(3)
        p = self.agents[i]
        t = time.monotonic()
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        time.sleep(1.0)
        self.start_agent(i)
        return f"host{i}" + (" (hosting)" if self.backend == "hosted" and i == 0 else ""), t, \
            time.monotonic()

    def f_partition(self):
        i = self.rng.randrange(3)
        t = time.monotonic()
        self.cluster.partition(i)
        try:
            time.sleep(self.partition_s)
        finally:
            self.cluster.heal(i)
        return f"host{i} for {self.partition_s:.0f} s", t, time.monotonic()

    def f_lossy(self):
        i = self.rng.randrange(3)
        t = time.monotonic()
        self.cluster.loss(LOSSY[0], hosts=[i])
        self.cluster.rate(LOSSY[1], hosts=[i], burst="256kb")
        try:
            time.sleep(self.partition_s)
        finally:
            dropped = self.cluster.dropped(i)
            self.cluster.clear_loss([i])
            self.cluster.clear_rate([i])
        return f"host{i} for {self.partition_s:.0f} s ({dropped} packets dropped)", t, \
            time.monotonic()

    def f_rdzv_restart(self):
        t = time.monotonic()
        os.kill(self.rdzv.pid, signal.SIGKILL)
        self.rdzv.wait(timeout=30)
        time.sleep(1.0)
        self.start_rdzv()
        return "host0", t, time.monotonic()

    def f_etcd_kill(self):
        i = self.rng.randrange(3)
        t = time.monotonic()
        os.kill(self.etcd[i].pid, signal.SIGKILL)
        self.etcd[i].wait(timeout=30)
        time.sleep(3.0)
        self.start_etcd(i)
        wait_until(lambda: self.etcd_healthy(i), 60, f"etcd member m{i} to be healthy again")
        return f"member m{i}", t, time.monotonic()

    def f_disk_full(self):
        # A write deletes the old PATH.prev first, so a disk that is merely
        # full still takes it; the files are pinned too (hard links, as a
        # backup job holding them would), so nothing is freed.
        pins = []
        for f in (self.ckpt, self.ckpt.with_name(self.ckpt.name + ".prev")):
            try:
                pin = self.ckdir / f"pinned.{len(pins)}"
                os.link(f, pin)
                pins.append(pin)
            except FileNotFoundError:
                pass
        filler = self.ckdir / "filler"
        t = time.monotonic()
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            chunk = b"\0" * (1 << 20)
            while True:
                try:
                    os.write(fd, chunk)
                except OSError:
                    if len(chunk) == 4096:
                        break
                    chunk = chunk[:len(chunk) // 16] or chunk
                    chunk = chunk if len(chunk) >= 4096 else b"\0" * 4096
        finally:
            os.close(fd)
        try:
            wait_until(lambda: self.journal.first(MARKERS["disk_full"], t), 120,
                       "a checkpoint write to fail on the full disk")
        finally:
            filler.unlink()
            for pin in pins:
                pin.unlink()
        return "checkpoint tmpfs", t, time.monotonic()

    def f_ckpt_corrupt(self):
        t0 = time.monotonic()
        hit = wait_until(lambda: self.journal.first(r"T0501: checkpoint: step", t0), 120,
                         "a checkpoint to be written")
        t = time.monotonic()
        with open(self.ckpt, "r+b") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(fh.tell() // 2)
            fh.write(os.urandom(4096))
        h, pid = self.pick_worker()
        os.kill(pid, signal.SIGKILL)
        step = re.search(r"step (\d+)", hit[2].string).group(1)
        return f"step {step}'s file; host{h} pid {pid} killed", t, t

    def inject(self, name):
        return getattr(self, "f_" + name)()


def epoch_batches(steps):
    return steps + CKPT_EVERY


def trainer_args(steps, ckpt, world):
    # One epoch longer than --steps: every checkpoint is inside the epoch,
    # so a round of another world size cannot resume it (the trainer refuses
    # a mid-epoch position counted with another world size) and never trains.
    return ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32",
            "--num-classes", "10", "--num-samples", str(2 * world * epoch_batches(steps)),
            "--batch-size", "2", "--epochs", "1", "--steps", str(steps), "--log-every", "1",
            "--threads", "1",
            "--seed", "5", "--checkpoint", str(ckpt), "--ckpt-every", str(CKPT_EVERY),
            "--collective-timeout", "60", "--init-timeout", "120"]


def reference_checksum(build, steps, nproc, work, tag):
    """The fault-free run: cddprun --standalone with 3 x nproc workers."""
    ck = work / "reference"
    ck.mkdir()
    env = dict(os.environ, LOGLEVEL="INFO", CDDP_TEST_TAG=tag, OMP_NUM_THREADS="1")
    r = subprocess.run([str(build / "launcher" / "cddprun"), "--standalone",
                        f"--nproc_per_node={3 * nproc}", "--no-python",
                        str(build / "trainer" / "cddp-train"),
                        *trainer_args(steps, ck / "ck.safetensors", 3 * nproc)],
                       capture_output=True, text=True, env=env, timeout=1800)
    text = r.stdout + r.stderr
    (work / "reference.log").write_text(text)
    sums = {rank: s for rank, n, s in SUM_RE.findall(text) if int(n) == steps}
    if r.returncode != 0 or len(sums) != 3 * nproc or len(set(sums.values())) != 1:
        raise ChaosError(f"the reference run failed (exit {r.returncode}):\n{text[-3000:]}")
    return sums["0"]


def schedule(rng, backend, n, short):
    """n faults for backend: every applicable kind once (shuffled) before
    any repeats."""
    kinds = [k for k, b in FAULTS.items() if backend in b]
    if short:
        kinds = [k for k in kinds if k not in ("partition", "lossy")]
    out = []
    while len(out) < n:
        batch = kinds[:]
        rng.shuffle(batch)
        out += batch
    return out[:n]


def listening(cluster, i):
    r = cluster.run(i, "ss", "-Hltnp")
    return [line for line in r.stdout.splitlines() if line.strip()]


def tagged(tag):
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if f"CDDP_TEST_TAG={tag}".encode() in env and running(int(d)):
            found.append(f"{d} {comm(int(d))}")
    return found


def run_backend(build, backend, faults, seed, work, reference, steps, nproc, tag, partition_s,
                out=print):
    """One chaos run. Returns a dict: rows (one per fault), checksums,
    problems (empty when every check held)."""
    rng = random.Random(f"{seed}/{backend}")
    work.mkdir(parents=True)
    job = Job(build, backend, work, steps, nproc, rng, tag, partition_s)
    rows, problems = [], []
    world = 3 * nproc
    try:
        job.setup()
        j = job.journal
        # Faults begin once two checkpoints are on disk (ckpt_corrupt has a
        # previous one to fall back on).
        wait_until(lambda: j.high_water() > 2 * CKPT_EVERY, 300, "the first steps")
        for k, name in enumerate(faults):
            gap = rng.randint(1, 3)
            base = j.high_water()
            wait_until(lambda: j.high_water() >= base + gap or not job.live_agents(), 300,
                       "training to go on")
            hw = j.high_water()
            if hw + 2 * CKPT_EVERY + 2 >= steps:
                problems.append(f"training ended before fault {k + 1} ({name}): raise --steps")
                break
            target, t_inj, t_end = job.inject(name)
            hw = j.high_water(before=t_inj)
            timeout = 240 + (partition_s if name in ("partition", "lossy") else 0)
            wait_until(lambda: settled(j, t_inj, t_end), timeout,
                       f"the job to train on after {name} (step {hw} when it began)")
            if name == "rdzv_restart":
                wait_until(lambda: len({s for _, s, _ in j.find(r"A0716|A0717|A0103", t_end)})
                           >= 3, 60, "every agent to reconnect to the new cddp-rdzv")
            row = analyse(j, name, target, t_inj, t_end, hw)
            rows.append(row)
            out(f"  {backend} fault {k + 1}/{len(faults)}: {fmt_row(row)}")
        # The end: every agent running exits 0.
        for i, p in job.agents.items():
            try:
                rc = p.wait(timeout=60 + 3 * steps)
            except subprocess.TimeoutExpired:
                raise ChaosError(f"agent on host{i} did not exit")
            if rc != 0:
                problems.append(f"agent on host{i} exited {rc}")
        text = "\n".join(t for _, _, t in j.snapshot())
        sums = {}
        for rank, n, s in SUM_RE.findall(text):
            if int(n) == steps:
                sums[rank] = s
        if len(sums) != world:
            problems.append(f"state checksums from {len(sums)} of {world} ranks")
        if set(sums.values()) != {reference}:
            problems.append(f"state checksums {sorted(set(sums.values()))} != reference "
                            f"{reference}")
        # Every step ran at the reference's world size: its epoch has the
        # reference's number of batches (another world size splits the
        # samples otherwise).
        lengths = {int(m.group(3)) for _, _, m in j.find(STEP_RE.pattern)}
        if lengths != {epoch_batches(steps)}:
            problems.append(f"steps ran in epochs of {sorted(lengths)} batches: another world "
                            f"size than {world} trained")
        rounds = ROUND_RE.findall(text)
        other = {int(r) for r, w, _ in rounds if int(w) != world}
        counted = max((int(c) for _, _, c in rounds), default=0)
        # Only the daemons listen now; then, with them gone, nothing at all.
        allowed = {"rdzv": {str(RDZV_PORT)}, "etcd": {"2379", "2380"}}.get(backend, set())
        time.sleep(0.5)
        for i in range(3):
            for line in listening(job.cluster, i):
                port = line.split()[3].rsplit(":", 1)[1]
                if port not in allowed:
                    problems.append(f"host{i}: a port still listens after the job: {line}")
        for p in ([job.rdzv] if job.rdzv else []) + list(job.etcd.values()):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    problems.append(f"{p.args[-1]} did not stop on SIGTERM")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (any(job.cluster.pids(i) for i in range(3))
                                               or tagged(tag)):
            time.sleep(0.1)
        for i in range(3):
            left = [f"{p} {comm(p)}" for p in job.cluster.pids(i)]
            if left:
                problems.append(f"host{i}: processes left (orphans): {left}")
            for line in listening(job.cluster, i):
                problems.append(f"host{i}: a port still listens: {line}")
        left = tagged(tag)
        if left:
            problems.append(f"processes of the run left outside the hosts: {left}")
        for mark in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            hits = j.find(re.escape(mark))
            if hits:
                problems.append(f"{hits[0][1]}: {hits[0][2].string}")
        if problems:
            problems.append("last lines:\n" + j.tail())
        return {"backend": backend, "rows": rows, "checksums": sums, "problems": problems,
                "other_rounds": len(other), "counted_restarts": counted, "journal": j}
    except (ChaosError, netns.pytest.skip.Exception) as e:
        if isinstance(e, ChaosError):
            problems.append(f"{e}\nlast lines:\n{job.journal.tail()}")
            return {"backend": backend, "rows": rows, "checksums": {}, "problems": problems,
                    "journal": job.journal}
        raise
    finally:
        job.teardown()


STOPS = r"A0503|A0103|A0402|A0901|A2110|A2111|A0109"


def settled(j, t_inj, t_end):
    """The job trains again after a fault: two steps beyond the highest it
    had reached before its workers last restarted (or before the fault was
    over, when none restarted), and no restart since those began."""
    resumes = j.find(RESUME_RE.pattern, t_inj)
    since = resumes[-1][0] if resumes else t_end
    stops = j.find(STOPS, since)
    if stops:
        return False
    return j.high_water() > j.high_water(before=since) + 1


def analyse(j, name, target, t_inj, t_end, hw):
    """One row of the table from the journal, once the job has settled."""
    det = j.first(MARKERS[name], t_inj)
    resumes = j.find(RESUME_RE.pattern, t_inj)
    redone, again, back, fallback = 0, None, None, False
    for t, _, m in resumes:
        redone += max(0, j.high_water(before=t) - int(m.group(2)))
        fallback |= m.group(1).endswith(".prev")
    if resumes:
        last = resumes[-1][0]
        reached = j.high_water(before=resumes[0][0])
        later = j.steps(after=last)
        again = later[0][0] - t_inj if later else None
        back = next((t - t_inj for t, k in later if k > reached), None)
    # The longest time without a step while the fault lasted or was recovered from.
    times = [t_inj] + [t for t, _ in j.steps(after=t_inj)]
    end = (times[-1] if back is None else t_inj + back)
    gaps = [b - a for a, b in zip(times, times[1:]) if b <= end + 1e-9]
    return {"fault": name, "target": target,
            "detected": det[0] - t_inj if det else None,
            "by": det[2].group(0) if det else "-",
            "again": again, "back": back, "pause": max(gaps) if gaps else None,
            "redone": redone, "restarts": len(resumes),
            "duration": t_end - t_inj, "fallback": fallback, "step": hw, "t": t_inj}


def fmt_s(v):
    return "-" if v is None else f"{v:.2f}"


def fmt_row(r):
    return (f"{r['fault']} ({r['target']}) at step {r['step']}: detected "
            f"{fmt_s(r['detected'])} s by {r['by']}, training again {fmt_s(r['again'])} s, "
            f"back {fmt_s(r['back'])} s, longest pause {fmt_s(r['pause'])} s, "
            f"{r['redone']} steps redone, {r['restarts']} restart(s)"
            + (", resumed from PATH.prev" if r["fallback"] else ""))


def table(results):
    lines = ["| backend | # | fault | target | at step | detected by | detection (s) "
             "| training again (s) | back at the step (s) | longest pause (s) | steps redone "
             "| worker restarts |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        for k, r in enumerate(res["rows"]):
            lines.append(f"| {res['backend']} | {k + 1} | {r['fault']} | {r['target']} "
                         f"| {r['step']} | {r['by']} | {fmt_s(r['detected'])} "
                         f"| {fmt_s(r['again'])} | {fmt_s(r['back'])} | {fmt_s(r['pause'])} "
                         f"| {r['redone']} | {r['restarts']} |")
    return "\n".join(lines)


def steps_for(faults, partition_s):
    return 4 * CKPT_EVERY + 10 * len(faults) + 12


def run_chaos(build, seed, nfaults, backends, work, nproc=1, short=False, partition_s=20.0,
              tag=None, out=print, plans=None):
    """Runs the reference, then each backend's chaos run. A list of results
    (run_backend's dicts). plans ({backend: [fault, ...]}) replaces the
    seeded schedule (the seed still picks the targets and the gaps)."""
    build = pathlib.Path(build).resolve()
    tag = tag or os.environ.get("CDDP_TEST_TAG") or f"chaos-{uuid.uuid4().hex}"
    if plans is None:
        plans = {b: schedule(random.Random(f"{seed}/{b}/plan"), b, nfaults, short)
                 for b in backends}
    for b, plan in plans.items():
        for f in plan:
            if b not in FAULTS.get(f, ()):
                raise ChaosError(f"fault {f} does not apply to the {b} backend")
    steps = max(steps_for(p, partition_s) for p in plans.values())
    t0 = time.monotonic()
    reference = reference_checksum(build, steps, nproc, work, tag)
    out(f"reference: {3 * nproc} workers, {steps} steps, state checksum {reference} "
        f"({time.monotonic() - t0:.1f} s)")
    results = []
    for b in backends:
        if b == "etcd" and not os.access(ETCD, os.X_OK):
            raise ChaosError("etcd is not installed (tools/setup.sh --test installs etcd-server)")
        t0 = time.monotonic()
        out(f"{b}: {', '.join(plans[b])}")
        res = run_backend(build, b, plans[b], seed, work / b, reference, steps, nproc, tag,
                          partition_s, out=out)
        res["seconds"] = time.monotonic() - t0
        res["reference"] = reference
        results.append(res)
        out(f"{b}: {'ok' if not res['problems'] else 'FAILED'} in {res['seconds']:.0f} s")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", type=int, default=9, help="faults per backend (9)")
    ap.add_argument("--backend", default="hosted,rdzv,etcd",
                    help="comma-separated: hosted, rdzv, etcd (all)")
    ap.add_argument("--nproc", type=int, default=1, help="workers per host (1)")
    ap.add_argument("--partition", type=float, default=20.0,
                    help="seconds a partition or a lossy link lasts (20)")
    ap.add_argument("--short", action="store_true",
                    help="no partition and no lossy link (the suite's schedule)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = ap.parse_args()
    backends = [b for b in args.backend.split(",") if b]
    for b in backends:
        if b not in BACKENDS:
            sys.exit(f"chaos: unknown backend '{b}' (hosted, rdzv, etcd)")
    if os.geteuid() != 0:
        sys.exit("chaos: needs root (network namespaces, mount, nft, tc)")
    work = pathlib.Path(tempfile.mkdtemp(prefix="chaos-"))
    ok = False
    try:
        results = run_chaos(args.build, args.seed, args.faults, backends, work, args.nproc,
                            args.short, args.partition)
        print()
        print(table(results))
        ok = True
        for res in results:
            print(f"\n{res['backend']}: state checksum {sorted(set(res['checksums'].values()))}"
                  f" (reference {res['reference']}); rounds of another world size, which "
                  f"trained nothing: {res.get('other_rounds', '-')}; restarts counted against "
                  f"--max_restarts: {res.get('counted_restarts', '-')}; {res['seconds']:.0f} s")
            for p in res["problems"]:
                ok = False
                print(f"PROBLEM: {p}")
    except ChaosError as e:
        print(f"chaos: {e}")
    finally:
        if args.keep or not ok:
            print(f"logs: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
