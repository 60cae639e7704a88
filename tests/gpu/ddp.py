#!/usr/bin/env python3
"""Data parallelism over NCCL with two ranks on one GPU (tools/gpu-check's ddp stage).

NCCL refuses two ranks on one GPU ("Duplicate GPU detected") unless each
rank has its own NCCL_HOSTID; then they talk over sockets on loopback, not
NVLink or shared memory. Every multi-rank run here goes through
tests/gpu/one_gpu_rank.sh (NCCL_HOSTID=cddp-$LOCAL_RANK, every rank on
device 0, LOCAL_RANK=0 for the program) under build/launcher/cddprun. Every
process (ours, torch's, torchrun) runs in this script's environment: the
caller's LD_LIBRARY_PATH (tools/gpu-check: the CUDA library directories),
which the wrapper does not touch; the bundle's binaries find their own
libraries by RUNPATH. The sub-checks, in the order of what the product
promises, each recorded as ok, failed or skipped (with the reason) and its
figures, and the JSON rewritten as each ends (--json):

  allreduce     cddp-collbench --check over --backend nccl --device cuda
                (every collective, results verified on every rank) under the
                first environment that works: NCCL_HOSTID,
                NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1, then also
                NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1; NCCL's transport.
                The rest use the environment found (when ours fails under
                every one, torch's probe finds it, so torch's checks still run)
  hang-restart  cddp-train --fault hang@step=5,rank=1 --collective-timeout T
                --checkpoint under cddprun --max_restarts=1: rank 0 exits 75
                with torchrun's error file within T + 1 s of waiting, the
                group is restarted, resumes from step 4's checkpoint and
                completes; the time from the hang to the restarted group's
                first step
  crash-async   --fault crash@step=3,rank=1 on two bare ranks (no launcher,
                which would stop rank 0 itself): rank 0 ends through the
                asynchronous-error path, exit 75, well before its timeout
  syncbn        2 ranks x batch B with --sync-bn against 1 rank x batch 2B
                from the same weights and samples: the mean of the two ranks'
                losses equals the one rank's loss and every state_dict tensor
                after 3 steps agrees, within 1e-3 relative (2e-4 absolute for
                tensors that start at zero) on cuda, 1e-4 (2e-5) on the CPU;
                without --sync-bn they must not (the comparison can fail)
  torch-ddp     tests/gpu/torch_ddp.py (the seed's DDP script: NCCL,
                DistributedSampler, DDP) with 2 ranks under cddprun and under
                torchrun: both complete with the same final loss; and 1 rank
  bandwidth     allreduce bus bandwidth (nccl-tests' definition, 1 MiB..128
                MiB) of cddp-collbench --bench and of torch's NCCL
                (torch_ddp.py --bench) in the same environment, side by side,
                and the host time each of our collectives cost (T2102:
                start, and settling NCCL's launch thread)
  step-time     cddp-train's step time at 1 and 2 ranks with the overlap on
                and off (--no-overlap), and the host time per collective:
                both ranks share the one GPU, so the 2-rank step includes the
                other rank's compute
  nccl-refusal  without NCCL_HOSTID NCCL refuses the pair (a torch probe),
                if time remains

The tolerance of syncbn: 1 rank x 2B and 2 x B compute the same function
(SyncBatchNorm normalises by the statistics of all 2B samples, and the
averaged gradient of two half-batch means is the gradient of the whole
batch's mean), but not in the same order: the statistics are two partial
sums added, the gradients two halves averaged in the allreduce, and cuDNN
chooses its algorithms per batch size. That is fp32 rounding compounded over
3 steps, the same sources parity.py allows 1e-3 for against PyTorch on the
GPU; on the CPU the compat test's 1e-4 holds.

    ddp.py --train cddp-train --cddprun cddprun [--collbench cddp-collbench]
           [--device cuda|cpu] [--budget S] [--checks a,b] --json out.json

--device cpu (tools/gpu-check's self-test) runs the same orchestration over
gloo on the CPU with small settings: the NCCL-only check skips. Exit 0 when
no sub-check failed, 1 when one did, 2 on bad arguments, 77 (skipped, one
line) on cuda when no GPU is visible (meson's suite gpu runs it:
tests/gpu/meson.build).
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path[:0] = [str(HERE), str(TESTS), str(TESTS / "compat")]

import gpu_common  # noqa: E402

WRAP = str(HERE / "one_gpu_rank.sh")
TORCH_SCRIPT = str(HERE / "torch_ddp.py")
CHECKS = ("allreduce", "hang-restart", "crash-async", "syncbn", "torch-ddp", "bandwidth",
          "step-time", "nccl-refusal")
EXIT_COLLECTIVE = 75
# What each environment adds to the NCCL_HOSTID the wrapper sets.
NCCL_VARIANTS = (
    {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"},
    {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1",
     "NCCL_SHM_DISABLE": "1"},
)
# cddp-train's one-line refusals of a device or communicator it cannot have
REFUSAL = re.compile(r"cddp-train: ((?:--device cuda|--backend nccl|--grad-reduce-dtype)[^\n]*)")
# T2102, rank 0's: the host time its NCCL collectives cost (trainer/comm/nccl.c)
HOST_TIME = re.compile(r"rank0 \S+ INFO T2102: NCCL: (\d+) collectives; host time per collective: "
                       r"start (\S+) us mean \(max (\S+)\), settling NCCL's launch \(in a later "
                       r"start or wait\) (\S+) us mean \(max (\S+)\)")
BENCH_SIZES = {"cuda": (1 << 20, 128 << 20, None), "cpu": (4096, 65536, 3)}
TRAINER_CHECKS = ("hang-restart", "crash-async", "syncbn", "step-time")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", required=True, help="the cddp-train binary")
    p.add_argument("--cddprun", required=True, help="the cddprun binary")
    p.add_argument("--collbench", help="the cddp-collbench binary (allreduce is skipped without)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--budget", type=float, default=200, help="bound on all checks together (s)")
    p.add_argument("--checks", default=",".join(CHECKS), help="a comma-separated subset")
    p.add_argument("--python", default=sys.executable, help="the Python with torch")
    p.add_argument("--json", help="write the result here")
    a = p.parse_args(argv)
    a.checks = [c for c in a.checks.split(",") if c]
    bad = [c for c in a.checks if c not in CHECKS]
    if bad or not a.checks:
        p.error(f"--checks: '{','.join(bad)}': each must be one of {', '.join(CHECKS)}")
    if a.budget <= 0:
        p.error("--budget: must be positive")
    return a


class Proc:
    """A process whose output lines are stamped (time.monotonic()) as they arrive."""

    def __init__(self, cmd, env, cwd=None):
        self.lines = []  # (t, "out" | "err", line)
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.p = subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True, errors="replace")
        self.readers = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                        for s, n in ((self.p.stdout, "out"), (self.p.stderr, "err"))]
        for t in self.readers:
            t.start()
        self.end = None

    def _read(self, stream, name):
        for line in stream:
            with self.lock:
                self.lines.append((time.monotonic(), name, line.rstrip("\n")))

    def wait(self, timeout):
        """The exit status; 124 after killing the whole process group past timeout."""
        try:
            rc = self.p.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            self.kill()
            rc = 124
        self.end = time.monotonic()
        for t in self.readers:
            t.join(5)
        return rc

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def text(self, which=None):
        with self.lock:
            return "\n".join(l for _, n, l in self.lines if which in (None, n))

    def first(self, pattern, after=0.0):
        """The stamp of the first line matching pattern (a regex) at or after `after`."""
        rx = re.compile(pattern)
        with self.lock:
            return next((t for t, _, l in self.lines if t >= after and rx.search(l)), None)


def gpu_visible():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(text, n=2500):
    return text[-n:]


class Stage:
    def __init__(self, a):
        self.a = a
        self.cuda = a.device == "cuda"
        self.end = time.monotonic() + a.budget
        self.results = []
        self.nccl_env = {} if self.cuda else dict(NCCL_VARIANTS[0])  # harmless on gloo
        self.nccl_ok = not self.cuda  # gloo needs no set-up
        self.nccl_why = ""
        self.trainer_refused = None
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="cddp-gpu-ddp-"))
        # (one environment for ours and torch's: the docstring)
        self.base_env = dict(os.environ, LOGLEVEL="DEBUG", PYTHONUNBUFFERED="1",
                             OMP_NUM_THREADS="1")
        self.t_start = time.time()
        self.train_help = self._help(a.train)
        self.torch_major = None

    def _help(self, binary):
        try:
            return subprocess.run([binary, "--help"], capture_output=True, text=True,
                                  timeout=30, env=self.base_env).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    def left(self):
        return self.end - time.monotonic()

    def record(self, name, status, t0, **kw):
        # (full: the whole output the refusal may be in; not kept)
        full = kw.pop("full", None) or kw.get("output_tail") or ""
        refusal = REFUSAL.search(full) if status == "failed" else None
        if refusal and name in TRAINER_CHECKS:
            # cddp-train said it cannot (a build without NCCL, say): the
            # checks that need it are skipped, with its words
            self.trainer_refused = "cddp-train refuses: " + refusal.group(1)
            status, kw = "skipped", {"reason": self.trainer_refused}
        r = {"check": name, "status": status, "seconds": round(time.monotonic() - t0, 1)}
        r.update(kw)
        self.results.append(r)
        why = kw.get("reason") or kw.get("error") or ""
        print(f"ddp: {name}: {status}" + (f" ({why})" if why else ""), flush=True)
        self.save(complete=False)
        return r

    def result(self, complete):
        failed = [r["check"] for r in self.results if r["status"] == "failed"]
        return {"device": self.a.device, "checks": self.results, "nccl_env": self.nccl_env,
                "seconds": round(time.time() - self.t_start, 1), "ok": not failed,
                "complete": complete}

    def save(self, complete):
        """The result so far into --json (whole: a temporary file renamed), so
        a stage cut short still says what each finished check found."""
        if not self.a.json:
            return
        tmp = self.a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.result(complete), f, indent=1)
        os.replace(tmp, self.a.json)

    def skip(self, name, why):
        return self.record(name, "skipped", time.monotonic(), reason=why)

    def verdict(self, name, t0, problems, output, **fig):
        """ok, or failed naming every problem with the end of the output."""
        if problems:
            return self.record(name, "failed", t0, error="; ".join(problems),
                               output_tail=tail(output), full=output, **fig)
        return self.record(name, "ok", t0, **fig)

    def cannot_start(self, need):
        """Why a cddp-train check cannot start (the trainer cannot, or less than
        `need` seconds of the stage are left), or None."""
        why = self.trainer_missing()
        if why:
            return why
        if self.left() < need:
            return f"stage budget: {int(self.left())} s left, it needs {need}"
        return None

    def env(self, **extra):
        e = dict(self.base_env)
        e.update(self.nccl_env)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def env_with(self, nccl_env, **extra):
        """env() with nccl_env in place of the environment found."""
        e = dict(self.base_env)
        e.update(nccl_env)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    # ---- launching ----

    def cddprun(self, nproc, prog, env, log_dir, restarts=0):
        cmd = [self.a.cddprun, f"--nproc_per_node={nproc}", "--standalone",
               f"--log_dir={log_dir}", f"--max_restarts={restarts}", "--no-python", WRAP] + prog
        return Proc(cmd, env)

    def trainer_device(self):
        """cddp-train's device and communicator flags."""
        args = ["--device", self.a.device]
        if "--backend" in self.train_help:
            args += ["--backend", "nccl" if self.cuda else "gloo"]
        # (cuda: 8 CPU threads a rank, for the synthetic batches: two ranks on 16 cores)
        return args + (["--tf32", "off", "--threads", "8"] if self.cuda else ["--threads", "1"])

    def trainer_missing(self):
        """Why cddp-train cannot run DDP on this device, or None."""
        if self.cuda and "--backend" not in self.train_help:
            return "this cddp-train has no --backend (the NCCL DDP path is not in this build)"
        if self.trainer_refused:
            return self.trainer_refused
        if not self.nccl_ok:
            return self.nccl_why or "no NCCL set-up worked for two ranks on one GPU"
        return None

    def torch_launcher(self):
        """torchrun for this Python's torch: torch.distributed.run, or on torch 1.x
        (Debian's, the CPU self-test) tests/compat/torchrun_py311.py."""
        if self.torch_major is None:
            r = subprocess.run([self.a.python, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=120)
            self.torch_major = int(r.stdout.strip().split(".")[0]) if r.returncode == 0 else 0
        if self.torch_major >= 2:
            return [self.a.python, "-m", "torch.distributed.run"]
        return [self.a.python, str(TESTS / "compat" / "torchrun_py311.py")]

    def torch_env(self, **extra):
        return self.env(**extra)

    def torch_run(self, launcher, nproc, out, env, timeout, extra=()):
        out.mkdir(parents=True, exist_ok=True)
        prog = [self.a.python, TORCH_SCRIPT, "--out", str(out), "--device", self.a.device,
                *extra]
        if launcher == "cddprun":
            p = self.cddprun(nproc, prog, env, out / "logs")
        else:
            # (--no_python: torch 1.13's spelling, which 2.x accepts too)
            p = Proc(self.torch_launcher() + [f"--nproc_per_node={nproc}", "--standalone",
                                              "--no_python", WRAP] + prog, env)
        rc = p.wait(timeout)
        res = None
        if (out / "result.json").exists():
            try:
                res = json.loads((out / "result.json").read_text())
            except ValueError:
                res = None
        return rc, res, p

    # ---- the checks ----

    def check_nccl_refusal(self):
        name, t0 = "nccl-refusal", time.monotonic()
        if not self.cuda:
            return self.skip(name, "NCCL only (--device cpu runs gloo)")
        if self.left() < 40:
            return self.skip(name, f"stage budget: {int(self.left())} s left")
        env = self.torch_env(CDDP_ONE_GPU_NO_HOSTID=1, NCCL_DEBUG="WARN", **NCCL_VARIANTS[0])
        rc, res, p = self.torch_run("cddprun", 2, self.tmp / "refusal", env,
                                    min(60, self.left() - 5), ["--probe"])
        text = p.text()
        dup = "Duplicate GPU detected" in text
        if rc == 0 and res and res.get("probe_ok"):
            return self.record(name, "ok", t0, refused=False, nccl=res.get("nccl"),
                               reason="this NCCL accepted two ranks on one GPU without "
                                      "NCCL_HOSTID")
        status = "ok" if dup else "failed"
        return self.record(name, status, t0, refused=True, duplicate_gpu_message=dup, rc=rc,
                           **({} if dup else {"error": "the probe failed, but not with "
                                                       "'Duplicate GPU detected'",
                                              "output_tail": tail(text)}))

    def env_found_by_torch(self):
        """The first NCCL environment under which a torch allreduce of two
        ranks works (torch_ddp.py --probe), into self.nccl_env; a dict of
        what was tried (and found) for the record."""
        tried = []
        for i, v in enumerate(NCCL_VARIANTS):
            if self.left() < 30:
                self.nccl_why = f"the stage budget ran out after {len(tried)} torch probes"
                return {"torch_probes": tried}
            env = self.torch_env(**dict(v, NCCL_DEBUG="INFO"))
            rc, res, p = self.torch_run("cddprun", 2, self.tmp / f"setup{i}", env,
                                        min(60, self.left() - 5), ["--probe"])
            ok = rc == 0 and bool(res and res.get("probe_ok"))
            transport = sorted({m.group(1) for m in re.finditer(r"via (\S+)", p.text())})
            tried.append({"env": dict(v, NCCL_HOSTID="cddp-$LOCAL_RANK"), "ok": ok, "rc": rc,
                          "transport": transport[:4]})
            if ok:
                self.nccl_env, self.nccl_ok = dict(v), True
                return {"torch_probes": tried, "torch_nccl": res.get("nccl"),
                        "torch": res.get("torch")}
        self.nccl_why = "no NCCL environment worked for two ranks on one GPU (see allreduce)"
        return {"torch_probes": tried}

    def check_allreduce(self):
        """(1) a small allreduce's results: cddp-collbench --check under the
        first NCCL environment that works, which the later checks use."""
        name, t0 = "allreduce", time.monotonic()
        cb = self.a.collbench
        if not cb or not os.path.exists(cb):
            fig = self.env_found_by_torch() if self.cuda else {}
            return self.record(name, "skipped", t0, reason="no cddp-collbench (tools/gpu-check "
                               "--pack makes the bundle)", **fig)
        dev = ["--backend", "nccl", "--device", "cuda"] if self.cuda else []
        if self.cuda:
            r = subprocess.run([cb, *dev], capture_output=True, text=True, timeout=60,
                               env={k: v for k, v in self.env().items()
                                    if k not in ("RANK", "WORLD_SIZE")})
            if "built without NCCL" in r.stderr:
                fig = self.env_found_by_torch()
                return self.record(name, "skipped", t0,
                                   reason="this cddp-collbench was built without NCCL", **fig)
        tried, line, out = [], "", ""
        for i, v in enumerate(NCCL_VARIANTS if self.cuda else NCCL_VARIANTS[:1]):
            if self.left() < 30:
                break
            env = self.env_with(v, **({"NCCL_DEBUG": "INFO"} if self.cuda else {}))
            p = self.cddprun(2, [cb, "--check", *dev, "--collective-timeout", "60"], env,
                             self.tmp / f"cb-check{i}")
            rc = p.wait(min(90, self.left() - 5))
            out = p.text()
            line = next((l for l in out.splitlines() if l.startswith("collbench: world")), "")
            ok = rc == 0 and "all results right" in line
            transport = sorted({m.group(1) for m in re.finditer(r"via (\S+)", out)})
            m = re.search(r"T2100: (NCCL \S+)", out)
            tried.append({"env": dict(v, NCCL_HOSTID="cddp-$LOCAL_RANK"), "ok": ok, "rc": rc,
                          "transport": transport[:4], "nccl": m.group(1) if m else None})
            if ok:
                self.nccl_env, self.nccl_ok = dict(v), True
                return self.record(name, "ok", t0, collbench_check=line,
                                   needed=dict(v, NCCL_HOSTID="cddp-$LOCAL_RANK"), tried=tried)
        # Ours failed everywhere: torch's probe still finds the environment,
        # so that torch's checks run and ours fail with their own words.
        fig = self.env_found_by_torch() if self.cuda else {}
        return self.record(name, "failed", t0, tried=tried, error=line or "cddp-collbench --check "
                           "failed under every NCCL environment", output_tail=tail(out), **fig)

    def check_bandwidth(self):
        """(6) allreduce bus bandwidth of ours and torch's NCCL in the same
        environment, and the host time each of our collectives cost."""
        name, t0 = "bandwidth", time.monotonic()
        cb = self.a.collbench
        if not cb or not os.path.exists(cb):
            return self.skip(name, "no cddp-collbench (tools/gpu-check --pack makes the bundle)")
        if not self.nccl_ok:
            return self.skip(name, self.nccl_why)
        if self.left() < 40:
            return self.skip(name, f"stage budget: {int(self.left())} s left")
        lo, hi, iters = BENCH_SIZES[self.a.device]
        sizes = ["--min-bytes", str(lo), "--max-bytes", str(hi)] + \
            (["--iters", str(iters)] if iters else [])
        dev = ["--backend", "nccl", "--device", "cuda"] if self.cuda else []
        p = self.cddprun(2, [cb, "--bench", "--json", *dev, *sizes, "--collective-timeout", "60"],
                         self.env(), self.tmp / "cb-bench")
        rc = p.wait(min(120, self.left() - 25))
        ours = {}
        for l in p.text("out").splitlines():
            try:
                r = json.loads(l[l.find("{"):]) if "{" in l else {}
            except ValueError:
                continue
            if r.get("impl") == "cddp":
                ours[r["bytes"]] = r
        fig, problems = {}, []
        m = HOST_TIME.search(p.text("err"))
        if m:
            fig["host_time"] = {"collectives": int(m.group(1)), "start_us_mean": float(m.group(2)),
                                "start_us_max": float(m.group(3)),
                                "settle_us_mean": float(m.group(4)),
                                "settle_us_max": float(m.group(5))}
        if rc != 0 or not ours:
            problems.append(f"cddp-collbench --bench exited {rc} with {len(ours)} rows")
            fig["output_tail"] = tail(p.text(), 1500)
        theirs = {}
        if self.left() >= 20:
            trc, res, tp = self.torch_run("cddprun", 2, self.tmp / "torch-bench", self.torch_env(),
                                          min(120, self.left() - 5), ["--bench", *sizes])
            theirs = {r["bytes"]: r for r in (res or {}).get("bench", [])}
            fig["torch_nccl"] = (res or {}).get("nccl")
            if trc != 0 or not theirs:
                problems.append(f"torch's bench exited {trc} with {len(theirs)} rows")
                fig["torch_output_tail"] = tail(tp.text(), 1500)
        else:
            problems.append("no time left for torch's bench")
        rows = []
        for b in sorted(set(ours) | set(theirs)):
            o, t = ours.get(b, {}), theirs.get(b, {})
            row = {"bytes": b, "iters": o.get("iters", t.get("iters")),
                   "cddp_time_us": o.get("time_us"), "cddp_busbw_gbps": o.get("busbw_gbps"),
                   "torch_time_us": t.get("time_us"), "torch_busbw_gbps": t.get("busbw_gbps")}
            if o.get("busbw_gbps") and t.get("busbw_gbps"):
                row["ratio"] = round(o["busbw_gbps"] / t["busbw_gbps"], 3)
            rows.append(row)
        fig["rows"] = rows
        fig["transport"] = ("NCCL over sockets on loopback (two ranks on one GPU: NCCL_HOSTID), "
                            "not NVLink" if self.cuda else "gloo over loopback TCP")
        if problems:
            return self.record(name, "failed", t0, error="; ".join(problems), **fig)
        return self.record(name, "ok", t0, **fig)

    def small_train(self, samples, batch):
        return ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32",
                "--num-classes", "10", "--num-samples", str(samples), "--batch-size", str(batch),
                "--epochs", "1", "--log-every", "1", *self.trainer_device()]

    def check_hang_restart(self):
        name, t0 = "hang-restart", time.monotonic()
        timeout = 20 if self.cuda else 5
        need = 3 * timeout + 30
        why = self.cannot_start(need)
        if why:
            return self.skip(name, why)
        d = self.tmp / "hang"
        d.mkdir()
        # 2 ranks x batch 4 over 64 samples: 8 steps; checkpoints every 2; rank 1 hangs in step 5
        args = [self.a.train, *self.small_train(64, 4), "--checkpoint", str(d / "ck.safetensors"),
                "--ckpt-every", "2", "--collective-timeout", str(timeout),
                "--fault", "hang@step=5,rank=1"]
        p = self.cddprun(2, args, self.env(), d / "logs", restarts=1)
        rc = p.wait(min(need + 60, self.left() - 5))
        out, err = p.text("out"), p.text("err")
        fig = {"collective_timeout_s": timeout, "rc": rc}
        t_hang = p.first(r"fault injection: hang at step 5 on rank 1")
        t_abort = p.first(r"rank0 \S+ \w+ T6010:") or p.first(r"exitcode: 75")
        t_resumed = p.first(r"=> resumed from checkpoint")
        t_first = p.first(r"T0002: step \d+ ", after=t_resumed) if t_resumed else None
        files = sorted(d.glob("logs/*/attempt_0/*/error.json"))
        msg = ""
        if files:
            try:
                msg = json.loads(files[0].read_text())["message"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = files[0].read_text()[:500]
        m = re.search(r"waited (\d+(?:\.\d+)?) s", msg)
        waited = float(m.group(1)) if m else None
        if t_hang and t_abort:
            fig["hang_to_abort_s"] = round(t_abort - t_hang, 2)
        if t_hang and t_first:
            fig["hang_to_restarted_first_step_s"] = round(t_first - t_hang, 2)
        if t_abort and t_first:
            fig["abort_to_restarted_first_step_s"] = round(t_first - t_abort, 2)
        fig["waited_s"] = waited
        fig["error_file_message"] = msg[:400]
        problems = []
        if rc != 0:
            problems.append(f"cddprun exited {rc}")
        if t_hang is None:
            problems.append("no 'fault injection: hang' line from rank 1")
        if not msg.startswith("CollectiveTimeoutError"):
            problems.append("no CollectiveTimeoutError in attempt 0's error file"
                            + (f" ({len(files)} error files)" if files else ""))
        if waited is not None and waited > timeout + 1.0:
            problems.append(f"rank 0 waited {waited} s, beyond --collective-timeout {timeout} + 1 s")
        if "exitcode: 75" not in err:
            problems.append("cddprun did not report exit code 75")
        if fig.get("hang_to_abort_s", 0) > timeout + 5:
            problems.append(f"rank 0 ended {fig['hang_to_abort_s']} s after the hang")
        if "=> resumed from checkpoint" not in out or "step 4)" not in out:
            problems.append("the restarted group did not resume from step 4's checkpoint")
        if not re.search(r"rank0 \S+ \w+ T0002: step 8 ", err):
            problems.append("the restarted group did not reach step 8")
        return self.verdict(name, t0, problems, err, **fig)

    def check_crash_async(self):
        name, t0 = "crash-async", time.monotonic()
        timeout = 40 if self.cuda else 30
        why = self.cannot_start(timeout + 20)
        if why:
            return self.skip(name, why)
        d = self.tmp / "crash"
        d.mkdir()
        port = free_port()
        args = [self.a.train, *self.small_train(64, 4), "--collective-timeout", str(timeout),
                "--fault", "crash@step=3,rank=1"]
        procs = {}
        for r in (0, 1):
            env = self.env(RANK=r, WORLD_SIZE=2, LOCAL_RANK=r, LOCAL_WORLD_SIZE=2,
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GROUP_RANK=0,
                           TORCHELASTIC_RESTART_COUNT=0,
                           TORCHELASTIC_ERROR_FILE=d / f"error-{r}.json")
            procs[r] = Proc([WRAP, *args], env)
        rc1 = procs[1].wait(min(timeout + 30, self.left() - 5))
        rc0 = procs[0].wait(min(timeout + 30, self.left() - 5))
        t1, t0_end = procs[1].end, procs[0].end
        fig = {"collective_timeout_s": timeout, "rc_rank0": rc0, "rc_rank1": rc1,
               "crash_to_rank0_exit_s": round(t0_end - t1, 2)}
        msg = ""
        ef = d / "error-0.json"
        if ef.exists():
            try:
                msg = json.loads(ef.read_text())["message"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = ef.read_text()[:500]
        fig["error_file_message"] = msg[:400]
        problems = []
        if rc1 != 1 or "fault injection: crash at step 3 on rank 1" not in procs[1].text():
            problems.append(f"rank 1 did not crash as injected (exit {rc1})")
        if rc0 != EXIT_COLLECTIVE:
            problems.append(f"rank 0 exited {rc0}, not {EXIT_COLLECTIVE}")
        if not msg:
            problems.append("rank 0 wrote no error file")
        elif msg.startswith("CollectiveTimeoutError"):
            problems.append("rank 0 timed out instead of seeing the peer's failure")
        if fig["crash_to_rank0_exit_s"] > timeout / 2:
            problems.append(f"rank 0 ended {fig['crash_to_rank0_exit_s']} s after the crash "
                            f"(its timeout: {timeout} s)")
        return self.verdict(name, t0, problems, procs[0].text(), **fig)

    def check_syncbn(self):
        name, t0 = "syncbn", time.monotonic()
        why = self.cannot_start(45)
        if why:
            return self.skip(name, why)
        try:
            import numpy as np
            import torch
            import torchvision
        except ImportError as e:
            return self.skip(name, f"{e} in {sys.executable}")
        import safetensors_py as st
        import test_trainer_parity as ref  # write_idx, compare_state

        rel_tol, abs_tol = (1e-3, 2e-4) if self.cuda else (1e-4, 2e-5)
        ref.REL_TOL, ref.ABS_TOL = rel_tol, abs_tol
        batch, steps, classes = 8, 3, 10
        d = self.tmp / "syncbn"
        (d / "data").mkdir(parents=True)
        rng = np.random.default_rng(11)
        n = 2 * batch * steps
        x = rng.integers(0, 256, (n, 32, 32), dtype=np.uint8)
        y = (np.arange(n) % classes).astype(np.uint8)
        rng.shuffle(y)
        ref.write_idx(d / "data", "train", x, y)
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=classes, zero_init_residual=True)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        st.save(d / "w0.safetensors", start, {"format": "pt"})

        def args(b, *extra):
            return [self.a.train, "--arch", "resnet18", "--data", f"idx:{d / 'data'}",
                    "--batch-size", str(b), "--epochs", "1", "--steps", str(steps),
                    "--no-shuffle", "--lr", "0.01", "--momentum", "0.9", "--weight-decay", "1e-4",
                    "--init", str(d / "w0.safetensors"), "--log-every", "1",
                    *self.trainer_device(), *(["--deterministic"] if self.cuda else []), *extra]

        runs = {}
        for key, nproc, b, extra in (("one", 1, 2 * batch, []), ("two", 2, batch, ["--sync-bn"]),
                                     ("plain", 2, batch, [])):
            if self.left() < 15:
                return self.record(name, "skipped", t0, reason="stage budget ran out")
            save = d / f"{key}.safetensors"
            if nproc == 1:
                env = {k: v for k, v in self.env().items()
                       if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                    "MASTER_PORT")}
                p = Proc(args(b, "--save", save), env)
            else:
                p = self.cddprun(2, args(b, "--save", save, *extra), self.env(), d / f"logs-{key}")
            rc = p.wait(min(120, self.left() - 5))
            if rc != 0 or not save.exists():
                return self.record(name, "failed", t0, error=f"the {key} run exited {rc}",
                                   output_tail=tail(p.text("err")), full=p.text("err"))
            losses = {}
            for m in re.finditer(r"cddp-train\[\d+\] (?:rank(\d+) )?\S+ DEBUG T0002: step (\d+) "
                                 r"loss (\S+)", p.text("err")):
                losses.setdefault(int(m.group(1) or 0), {})[int(m.group(2))] = float(m.group(3))
            runs[key] = (st.load(save)[0], losses)
        one_loss = [runs["one"][1].get(0, {}).get(s) for s in range(1, steps + 1)]
        two = runs["two"][1]
        mean_loss = [(two[0][s] + two[1][s]) / 2 if s in two.get(0, {}) and s in two.get(1, {})
                     else None for s in range(1, steps + 1)]
        worst = {"loss": 0.0, "rel": 0.0, "abs": 0.0}
        fig = {"rel_tol": rel_tol, "abs_tol": abs_tol, "losses_one_rank": one_loss,
               "losses_two_ranks_mean": mean_loss}
        try:
            assert None not in one_loss and None not in mean_loss, "a step's loss is missing"
            for s, (o, t) in enumerate(zip(mean_loss, one_loss), 1):
                worst["loss"] = max(worst["loss"], abs(o - t) / abs(t))
                assert abs(o - t) / abs(t) < rel_tol, f"loss of step {s}: 2 ranks {o}, 1 rank {t}"
            ref.compare_state(torch, "after 3 steps", runs["two"][0], runs["one"][0], start, worst)
        except AssertionError as e:
            return self.record(name, "failed", t0, error=str(e), worst=worst, **fig)
        control = {"loss": 0.0, "rel": 0.0, "abs": 0.0}
        ref.REL_TOL, ref.ABS_TOL = float("inf"), float("inf")
        ref.compare_state(torch, "plain", runs["plain"][0], runs["one"][0], start, control)
        fig["worst"], fig["plain_bn_worst"] = worst, control
        if control["rel"] <= 10 * rel_tol:
            return self.record(name, "failed", t0, error="without --sync-bn the two ranks agree "
                               "with one rank too: the comparison cannot fail", **fig)
        return self.record(name, "ok", t0, **fig)

    def check_torch_ddp(self):
        name, t0 = "torch-ddp", time.monotonic()
        if not self.nccl_ok:
            return self.skip(name, self.nccl_why)
        if self.left() < 60:
            return self.skip(name, f"stage budget: {int(self.left())} s left")
        extra = [] if self.cuda else ["--samples", "64", "--batch-size", "16"]
        fig, problems = {}, []
        for key, launcher, nproc in (("cddprun_2", "cddprun", 2), ("torchrun_2", "torchrun", 2),
                                     ("cddprun_1", "cddprun", 1)):
            if self.left() < 25:
                fig[key] = {"skipped": "stage budget"}
                continue
            rc, res, p = self.torch_run(launcher, nproc, self.tmp / f"torch-{key}",
                                        self.torch_env(), min(150, self.left() - 5), extra)
            if rc != 0 or not res or "final_loss" not in res:
                problems.append(f"{key} exited {rc}")
                fig[key] = {"rc": rc, "output_tail": tail(p.text(), 1500)}
                continue
            fig[key] = {k: res.get(k) for k in ("final_loss", "losses", "steps", "weights_sha256",
                                                "seconds", "torch", "nccl")}
        a, b = fig.get("cddprun_2", {}), fig.get("torchrun_2", {})
        if "final_loss" in a and "final_loss" in b:
            diff = abs(a["final_loss"] - b["final_loss"]) / abs(b["final_loss"])
            fig["final_loss_rel_diff"] = diff
            fig["same_weights"] = a["weights_sha256"] == b["weights_sha256"]
            if diff > 1e-5:
                problems.append(f"final loss under cddprun {a['final_loss']} and torchrun "
                                f"{b['final_loss']} differ by {diff:.2e} relative")
        if problems:
            return self.record(name, "failed", t0, error="; ".join(problems), **fig)
        return self.record(name, "ok", t0, **fig)

    def check_step_time(self):
        name, t0 = "step-time", time.monotonic()
        why = self.cannot_start(20)
        if why:
            return self.skip(name, why)
        if self.cuda:
            arch, size, batch, steps, warmup = "resnet50", 224, 32, 10, 3
        else:
            arch, size, batch, steps, warmup = "resnet18", 32, 4, 4, 1
        rows, row_full = [], ""
        for world in (1, 2):
            for overlap in (True, False):
                if self.left() < 20:
                    rows.append({"world": world, "overlap": overlap, "skipped": "stage budget"})
                    continue
                args = [self.a.train, "--arch", arch, "--data", "synthetic", "--image-size",
                        str(size), "--num-classes", "100", "--num-samples",
                        str(batch * world * (steps + 1)), "--batch-size", str(batch), "--steps",
                        str(steps), "--epochs", "1", "--log-every", "1000000",
                        *self.trainer_device()] + ([] if overlap else ["--no-overlap"])
                p = self.cddprun(world, args, self.env(), self.tmp / f"st-{world}-{overlap}")
                rc = p.wait(min(120, self.left() - 5))
                err = p.text("err")
                times = [float(m.group(1)) for m in re.finditer(
                    r"cddp-train\[\d+\] rank0 \S+ DEBUG T0002: step \d+ loss \S+ time (\S+) s", err)]
                row = {"world": world, "overlap": overlap, "rc": rc}
                if rc != 0 or len(times) != steps:
                    row["error"] = f"exit {rc}, {len(times)} step times"
                    row["output_tail"] = tail(err, 1200)
                    row_full = err
                else:
                    step = statistics.median(times[warmup:])
                    row.update(step_ms=round(step * 1e3, 2),
                               img_per_s=round(world * batch / step, 1))
                    m = re.search(r"rank0 \S+ INFO T6203: DDP: .*\(([\d.]+) ms/step\) waiting", err)
                    if m:
                        row["exposed_comm_ms"] = float(m.group(1))
                    m = HOST_TIME.search(err)
                    if m:  # (NCCL's only: one rank has no communicator, gloo no T2102)
                        row["host_us_per_collective"] = float(m.group(2))
                        row["settle_us_per_collective"] = float(m.group(4))
                rows.append(row)
        failed = [r for r in rows if "error" in r]
        fig = {"arch": arch, "image_size": size, "batch_per_rank": batch, "steps": steps,
               "warmup": warmup, "rows": rows,
               "note": "both ranks share one GPU: the 2-rank step includes the other rank's "
                       "compute, and the allreduce runs over loopback sockets" if self.cuda else
                       "CPU self-test: the figures mean nothing"}
        if failed:
            return self.record(name, "failed", t0, error=failed[0]["error"],
                               output_tail=failed[0]["output_tail"], full=row_full, **fig)
        return self.record(name, "ok", t0, **fig)


def main(argv):
    a = parse(argv)
    for what, path in (("--train", a.train), ("--cddprun", a.cddprun)):
        if not os.path.exists(path):
            print(f"ddp: {what} {path}: not found", file=sys.stderr)
            return 2
    if a.device == "cuda" and not gpu_visible():
        print("ddp: skipped: no NVIDIA GPU visible (nvidia-smi -L)")
        return 77
    s = Stage(a)
    try:
        if s.cuda and "allreduce" not in a.checks:
            s.env_found_by_torch()  # (the allreduce check finds it otherwise)
        for c in CHECKS:
            if c not in a.checks:
                continue
            try:
                getattr(s, "check_" + c.replace("-", "_"))()
            except Exception as e:  # a bug here is one failed check, never a lost report
                s.record(c, "failed", time.monotonic(), error=f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(s.tmp, ignore_errors=True)
    result = s.result(complete=True)
    s.save(complete=True)
    failed = [r["check"] for r in s.results if r["status"] == "failed"]
    print("ddp: " + (f"FAILED: {', '.join(failed)}" if failed else "no check failed")
          + f" ({result['seconds']} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    gpu_common.run_main(main)
