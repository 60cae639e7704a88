#!/usr/bin/env python3
"""cddprun beside the oracle's torchrun: the pieces tests/compat's
comparisons share, and the side-by-side runs tools/torch-check reports.

As a module (tests/conftest.py and test_torchrun_compat.py use it):

  probe(py)               tests/compat/torch_probe.py's JSON for that Python
  torchrun_cmd(py, info)  how to start that torch's torchrun
  documented_env(info)    the worker variables whose values differ on purpose
  env_differences(...)    what differs between two workers' environments
                          beyond what docs/torchrun-compat.md documents
  mask_table(stderr)      the failure table, times, hosts, pids and paths masked

As a program (run with any Python 3; --python is the torch under test):

  side_by_side.py seed --python PY --cddprun PATH [--nproc 4] --json OUT
      tests/compat/ddp_train.py (the seeds' DDP script: gloo, CPU) with
      --nproc workers under torchrun and under cddprun: both exit 0 with the
      same losses and weights; every worker's environment compared (the
      whole diff is reported, undocumented differences fail); start-up
      times. Then --crash-rank 0 under both: exit codes, the failure
      tables and the agents' error files.
  side_by_side.py seed-gpu --python PY --cddprun PATH --json OUT
      tests/gpu/torch_ddp.py (the seed on a GPU: NCCL, one rank) under both:
      both exit 0 with the same losses; start-up times. Skipped, with the
      reason, when this torch sees no CUDA device.
  side_by_side.py train --python PY --cddprun PATH --train PATH --json OUT
      cddp-train --device cpu, 2 ranks (gloo), under torchrun --no_python
      (its c10d rendezvous, --standalone, and its static one) and under
      cddprun: the same state checksum on every rank and launcher, and each
      run bootstrapped through the store this torch version hands it.

The JSON is {"torch": probe(py), "checks": [{"check", "status" (ok,
failed or skipped), "seconds", "error" or "reason", figures...}]}. Exit
status: 0 when no check failed, 1 when one did, 2 on bad arguments.
"""
import argparse
import json
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


# ---- the shared pieces ----

def probe(py):
    """What py's torch is and does (torch_probe.py); {"error": ...} without one."""
    try:
        r = subprocess.run([py, str(HERE / "torch_probe.py")], capture_output=True, text=True,
                           timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{py}: {e}"}
    if r.returncode != 0:
        return {"error": f"torch_probe.py exited {r.returncode}: {r.stderr.strip()[-300:]}"}
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": f"torch_probe.py printed no JSON: {r.stdout[-300:]!r}"}


def torchrun_cmd(py, info):
    """The command that starts py's torchrun the way its version needs:
    torch 1.13 on Python >= 3.11 through tests/compat/torchrun_py311.py (its
    Std.from_str("0") returns None there, and torchrun crashes before it
    starts a worker); a torch without that bug (2.x) unpatched, as
    `python -m torch.distributed.run` (what the torchrun script runs)."""
    if info.get("torchrun_needs_std_patch"):
        return [py, str(HERE / "torchrun_py311.py")]
    return [py, "-m", "torch.distributed.run"]


def documented_env(info):
    """Worker variables whose value differs on purpose (docs/torchrun-compat.md,
    "Environment"), as (torchrun's, cddprun's), for this torch. Every other
    variable must be equal, so one that a torch version sets as cddprun does
    is compared as any other."""
    d = {
        # cddp's progress channel (docs/status.md): the pipe is the worker's fd 3.
        "CDDP_PROGRESS_FD": (None, "3"),
    }
    if info["nccl_async_env"] == "NCCL_ASYNC_ERROR_HANDLING":
        # torch < 2.2 (1.13) sets the old name; torch >= 2.2, like cddprun,
        # the TORCH_ one (then the two launchers agree on both).
        d["NCCL_ASYNC_ERROR_HANDLING"] = ("1", None)
        d["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = (None, "1")
    if not info["exports_signals_to_handle"]:
        # a torch without LaunchConfig.signals_to_handle (1.13; it came after
        # pytorch#154849) does not export it; cddprun does, as newer torch.
        d["TORCHELASTIC_SIGNALS_TO_HANDLE"] = (None, "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    return d


def env_differences(te, ce, info, attempt, lr, error_file_re, ignore=("OUT", "_")):
    """What differs between torchrun's worker environment te and cddprun's ce
    (attempt, local rank lr) beyond the documented differences: a list of
    lines, empty when they agree. TORCHELASTIC_ERROR_FILE is compared by
    shape (error_file_re, formatted with attempt and lr: the temporary
    directories differ), MASTER_PORT as a number (each launcher's own free
    port), CDDP_RDZV_ROUND as cddp's own round number (torchrun has none)."""
    documented = documented_env(info)
    out = []
    for k in sorted(set(te) | set(ce)):
        if k in ignore:
            continue
        tv, cv = te.get(k), ce.get(k)
        if k in documented:
            if (tv, cv) != documented[k]:
                out.append(f"{k}: torchrun {tv!r}, cddprun {cv!r}; documented {documented[k]!r}")
        elif k == "TORCHELASTIC_ERROR_FILE":
            pat = error_file_re.format(attempt=attempt, lr=lr)
            for who, v in (("torchrun", tv), ("cddprun", cv)):
                if not v or not re.search(pat, v):
                    out.append(f"{k}: {who} {v!r} does not match {pat}")
        elif k == "MASTER_PORT":
            if not (tv or "").isdigit() or not (cv or "").isdigit():
                out.append(f"{k}: torchrun {tv!r}, cddprun {cv!r}")
        elif k == "CDDP_RDZV_ROUND":
            # cddp's own (docs/torchrun-compat.md): the rendezvous round, a new
            # one each attempt; torchrun has none.
            if tv is not None or not (cv or "").isdigit() or int(cv) < attempt + 1:
                out.append(f"{k}: torchrun {tv!r}, cddprun {cv!r}")
        elif tv != cv:
            out.append(f"{k}: torchrun {tv!r}, cddprun {cv!r}")
    return out


def mask_table(stderr):
    """The failure table's lines (from the first ===== line to the last) with
    what differs between any two runs masked: times, hosts, pids, the
    directories of error files and the files in tracebacks. Raises
    ValueError when stderr holds no table."""
    lines = stderr.splitlines()
    rules = [i for i, l in enumerate(lines) if l.startswith("=====")]
    if not rules:
        raise ValueError("no failure table in the output")
    masked = []
    for l in lines[rules[0]:rules[-1] + 1]:
        l = re.sub(r"time      : \S+", "time      : T", l)
        l = re.sub(r"host      : \S+", "host      : H", l)
        l = re.sub(r"\(pid: \d+\)", "(pid: P)", l)
        l = re.sub(r"received by PID \d+", "received by PID P", l)
        l = re.sub(r"/\S*/attempt_", "DIR/attempt_", l)
        l = re.sub(r'File "[^"]*"', 'File "F"', l)
        masked.append(l)
    return masked


# ---- the side-by-side runs ----

def free_port():
    """A port that was free a moment ago, below the ephemeral range (as
    tests/conftest.py's free_port, which says why)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, 29000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(text, n=3000):
    return text if len(text) <= n else "..." + text[-n:]


class Runs:
    """The checks of one subcommand and what they share."""

    def __init__(self, a):
        self.a = a
        self.info = probe(a.python)
        self.checks = []
        self.work = pathlib.Path(tempfile.mkdtemp(prefix="cddp-side-by-side-"))
        # Each launcher gets the same environment: no OMP_NUM_THREADS (both set
        # it to 1 for several workers), a UTF-8 locale (a C locale makes
        # Python add LC_CTYPE to torchrun's own environment, PEP 538), the
        # same temporary directory, and the torch Python for .py workers. PWD
        # names the folder they run in, as a shell would: a shell started in
        # between (tools/torch-check's wrappers) resets a stale one, and that
        # would show as a difference between the launchers.
        self.base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        self.base.update(LC_ALL="C.UTF-8", TMPDIR=str(self.work), PYTHON_EXEC=a.python,
                         PWD=str(self.work))

    def record(self, name, status, t0, **kw):
        c = {"check": name, "status": status, "seconds": round(time.monotonic() - t0, 1)}
        c.update(kw)
        self.checks.append(c)
        why = kw.get("error") or kw.get("reason") or ""
        print(f"side-by-side: {name}: {status}" + (f" ({why[:300]})" if why else ""), flush=True)
        return c

    def launcher(self, which):
        if which == "torchrun":
            return torchrun_cmd(self.a.python, self.info)
        return [self.a.cddprun]

    def launch(self, which, args, env, timeout):
        """(exit code, stdout, stderr, seconds, launch time): 124 on timeout."""
        cmd = self.launcher(which) + [str(x) for x in args]
        t_launch = time.time()
        # In its own session. A launcher past its time gets SIGTERM first,
        # which both forward to their workers (each in a session of its own,
        # out of reach of a killpg here), then SIGKILL.
        try:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=self.work, start_new_session=True)
        except OSError as e:
            return 127, "", f"{cmd[0]}: {e}", 0.0, t_launch
        try:
            out, err = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                out, err = p.communicate(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
            rc = 124
            err += f"\n(timed out after {timeout} s)"
        return rc, out, err, time.time() - t_launch, t_launch

    def write(self):
        """Writes the JSON (which keeps what the runs showed) and removes the
        runs' folder; the exit status."""
        with open(self.a.json, "w") as f:
            json.dump({"torch": self.info, "checks": self.checks}, f, indent=1)
        shutil.rmtree(self.work, ignore_errors=True)
        return 1 if any(c["status"] == "failed" for c in self.checks) else 0


def read_ranks(d, n):
    """The --env-out files of ranks 0..n-1 that exist: {rank: record}."""
    got = {}
    for r in range(n):
        p = d / f"rank{r}.json"
        if p.exists():
            try:
                got[r] = json.loads(p.read_text())
            except ValueError:
                pass
    return got


def startup(recs, t_launch, t_exit):
    """Start-up and tear-down figures (seconds) from the workers' times."""
    fig = {"first_worker_entered_s": round(min(r["t_enter"] for r in recs) - t_launch, 3)}
    if all("t_init" in r for r in recs):
        fig["all_initialised_s"] = round(max(r["t_init"] for r in recs) - t_launch, 3)
        fig["exit_after_last_worker_s"] = round(t_exit - max(r["t_end"] for r in recs), 3)
    fig["wall_s"] = round(t_exit - t_launch, 3)
    return fig


def cmd_seed(a):
    runs = Runs(a)
    if "error" in runs.info:
        runs.record("seed", "skipped", time.monotonic(), reason=runs.info["error"])
        return runs.write()
    script = HERE / "ddp_train.py"
    n = a.nproc
    res, envs, figs = {}, {}, {}
    t0 = time.monotonic()
    problems = []
    for which in ("torchrun", "cddprun"):
        out = runs.work / f"seed-{which}"
        (out / "env").mkdir(parents=True)
        rc, so, se, secs, t_launch = runs.launch(
            which, [f"--nproc_per_node={n}", f"--master_port={free_port()}",
                    "--monitor_interval=0.1", script, "--out", out, "--env-out", out / "env"],
            runs.base, a.timeout)
        t_exit = t_launch + secs
        recs = read_ranks(out / "env", n)
        figs[which] = {"exit_code": rc}
        if rc != 0:
            problems.append(f"{which} exited {rc}: {tail(se, 1500)}")
        if len(recs) == n:
            figs[which].update(startup(list(recs.values()), t_launch, t_exit))
            envs[which] = recs
        else:
            problems.append(f"{which}: {len(recs)} of {n} workers wrote their environment")
        try:
            res[which] = json.loads((out / "result.json").read_text())
        except (OSError, ValueError):
            problems.append(f"{which}: no result.json")
    if len(res) == 2:
        t, c = res["torchrun"], res["cddprun"]
        if c["world_size"] != n or c["losses"] != t["losses"] \
                or c["weights_sha256"] != t["weights_sha256"]:
            problems.append(f"results differ: torchrun {t['losses']} {t['weights_sha256'][:16]}, "
                            f"cddprun {c['losses']} {c['weights_sha256'][:16]}")
    runs.record(f"seed ({n} workers, gloo)", "failed" if problems else "ok", t0,
                error="; ".join(problems), launchers=figs,
                losses=res.get("cddprun", {}).get("losses"))

    # Every worker's environment, key by key.
    t0 = time.monotonic()
    if len(envs) == 2:
        undocumented, diff = [], {}
        for r in range(n):
            te, ce = envs["torchrun"][r]["env"], envs["cddprun"][r]["env"]
            undocumented += [f"rank {r}: {d}" for d in env_differences(
                te, ce, runs.info, 0, r, r"/attempt_{attempt}/{lr}/error\.json$")]
            for k in sorted(set(te) | set(ce)):
                if te.get(k) != ce.get(k):
                    diff.setdefault(k, {})[str(r)] = [te.get(k), ce.get(k)]
        runs.record("seed: worker environment", "failed" if undocumented else "ok", t0,
                    error="; ".join(undocumented), diff=diff,
                    documented=sorted(documented_env(runs.info)))
    else:
        runs.record("seed: worker environment", "failed", t0,
                    error="the runs above left no environments to compare")

    # A crash: rank 0 raises under @record, the others wait to be stopped.
    t0 = time.monotonic()
    tables, files, codes, problems = {}, {}, {}, []
    for which in ("torchrun", "cddprun"):
        out = runs.work / f"crash-{which}"
        (out / "env").mkdir(parents=True)
        agent_file = out / "agent-error.json"
        rc, so, se, secs, _ = runs.launch(
            which, [f"--nproc_per_node={n}", f"--master_port={free_port()}",
                    "--monitor_interval=0.1", script, "--out", out, "--env-out", out / "env",
                    "--crash-rank", "0"],
            dict(runs.base, TORCHELASTIC_ERROR_FILE=str(agent_file)), a.timeout)
        codes[which] = rc
        try:
            tables[which] = mask_table(se)
        except ValueError as e:
            problems.append(f"{which}: {e}: {tail(se, 1500)}")
        try:
            files[which] = json.loads(agent_file.read_text())["message"]
        except (OSError, ValueError, KeyError, TypeError):
            problems.append(f"{which}: no agent error file with a message")
    if codes.get("torchrun") != 1 or codes.get("cddprun") != 1:
        problems.append(f"exit codes: torchrun {codes.get('torchrun')}, cddprun "
                        f"{codes.get('cddprun')} (1 expected)")
    if len(tables) == 2:
        t, c = tables["torchrun"], tables["cddprun"]
        if runs.info.get("lists_stopped_peers"):
            # this torch lists the peers it stopped, as cddprun: whole tables
            if t != c:
                problems.append("the failure tables differ")
        else:
            # torch 1.13 lists only the failed worker; cddprun (as torch 2.x)
            # also the stopped ones (docs/torchrun-compat.md): the root causes
            root = [i for i, l in enumerate(t) if l.startswith("Root Cause")]
            croot = [i for i, l in enumerate(c) if l.startswith("Root Cause")]
            if not root or not croot or t[root[0]:] != c[croot[0]:]:
                problems.append("the root causes differ")
            if "  <NO_OTHER_FAILURES>" not in t:
                problems.append("torchrun listed other failures, which this torch "
                                "(no re-poll after stopping) should not")
        if not any("ValueError: rank 0 failed on purpose" in l for l in c):
            problems.append("cddprun's table lacks the worker's exception")
    if len(files) == 2:
        t, c = files["torchrun"], files["cddprun"]
        if (c.get("message"), c.get("errorCode")) != (t.get("message"), t.get("errorCode")):
            problems.append(f"agent error files: torchrun {t.get('message')!r} "
                            f"{t.get('errorCode')!r}, cddprun {c.get('message')!r} "
                            f"{c.get('errorCode')!r}")
    runs.record("seed: crash of rank 0", "failed" if problems else "ok", t0,
                error="; ".join(problems), exit_codes=codes, tables=tables)
    return runs.write()


def cmd_seed_gpu(a):
    runs = Runs(a)
    t0 = time.monotonic()
    if "error" in runs.info:
        runs.record("seed on the GPU", "skipped", t0, reason=runs.info["error"])
        return runs.write()
    if not runs.info.get("cuda"):
        runs.record("seed on the GPU (NCCL, 1 rank)", "skipped", t0,
                    reason=f"torch {runs.info.get('torch')} sees no CUDA device")
        return runs.write()
    script = ROOT / "tests" / "gpu" / "torch_ddp.py"
    res, figs, problems = {}, {}, []
    for which in ("torchrun", "cddprun"):
        out = runs.work / f"gpu-{which}"
        out.mkdir(parents=True)
        rc, so, se, secs, _ = runs.launch(
            which, ["--nproc_per_node=1", f"--master_port={free_port()}",
                    "--monitor_interval=0.1", script, "--out", out, "--device", "cuda"],
            runs.base, a.timeout)
        figs[which] = {"exit_code": rc, "wall_s": round(secs, 3)}
        if rc != 0:
            problems.append(f"{which} exited {rc}: {tail(se, 1500)}")
        try:
            res[which] = json.loads((out / "result.json").read_text())
            figs[which]["worker_s"] = res[which].get("seconds")
        except (OSError, ValueError):
            problems.append(f"{which}: no result.json")
    if len(res) == 2:
        t, c = res["torchrun"], res["cddprun"]
        if c.get("losses") != t.get("losses"):
            problems.append(f"losses differ: torchrun {t.get('losses')}, cddprun {c.get('losses')}")
        figs["same_weights"] = c.get("weights_sha256") == t.get("weights_sha256")
        figs["nccl"] = c.get("nccl")
    runs.record("seed on the GPU (NCCL, 1 rank)", "failed" if problems else "ok", t0,
                error="; ".join(problems), launchers=figs,
                losses=res.get("cddprun", {}).get("losses"))
    return runs.write()


def store_used(stderr):
    """Which store cddp-train's ranks bootstrapped through, from their
    LOGLEVEL=DEBUG lines: 'agent TCPStore, <dialect>' or 'rank 0's store'."""
    m = re.findall(r"T6031: connected to the agent's TCPStore at \S+ \((.*)\)", stderr)
    if m:
        return f"agent TCPStore, {m[0]} ({len(m)} ranks)"
    if "T6021: bootstrap store serving" in stderr:
        return "rank 0's bootstrap store"
    return "unknown"


def expected_store(info, rendezvous):
    """The store two cddp-train ranks bootstrap through under this torch's
    torchrun with that rendezvous ("static" or "c10d"), as store_used()
    words it: the agent's TCPStore (static in every version; c10d from torch
    2.4, pytorch#128096), in the dialect of this torch's TCPStore (V1 up to
    torch 2.0, V2, which opens with VALIDATE, after); else our rank 0's."""
    dialect = "V1 (torch <= 2.0)" if tuple(info["version"]) <= (2, 0) else "V2 (torch 2.x)"
    if rendezvous == "static" or info.get("c10d_agent_store"):
        return f"agent TCPStore, {dialect} (2 ranks)"
    return "rank 0's bootstrap store"


def cmd_train(a):
    runs = Runs(a)
    t0 = time.monotonic()
    if "error" in runs.info:
        runs.record("cddp-train under torchrun", "skipped", t0, reason=runs.info["error"])
        return runs.write()
    tiny = ["--device", "cpu", "--threads", "1", "--arch", "resnet18", "--data", "synthetic",
            "--image-size", "32", "--num-classes", "10", "--epochs", "1", "--log-every", "1",
            "--num-samples", "16", "--batch-size", "4", "--steps", "2"]
    # (launcher, its rendezvous (flags and name), the store its workers must
    # use (the start of store_used's answer), and why)
    cases = [
        ("torchrun", ["--standalone"], "c10d", expected_store(runs.info, "c10d"),
         "c10d: torch >= 2.4 shares the agent's store (pytorch#128096); 1.13 leaves "
         "MASTER_PORT to rank 0"),
        ("torchrun", [f"--master_port={free_port()}"], "static",
         expected_store(runs.info, "static"),
         "static: the agent serves a TCPStore on MASTER_PORT in every version"),
        ("cddprun", ["--standalone"], "--standalone", "agent TCPStore, ",
         "cddprun's agent serves its TCPStore (store/tcpstore.c), in the dialect the client "
         "settles on"),
    ]
    sums = {}
    for which, flags, rdzv, want, why in cases:
        t1 = time.monotonic()
        name = f"cddp-train under {which} ({rdzv})"
        rc, so, se, secs, _ = runs.launch(
            which, flags + ["--nproc_per_node=2", "--no_python", a.train] + tiny,
            dict(runs.base, LOGLEVEL="DEBUG"), a.timeout)
        got = re.findall(r"after 2 steps: state checksum (\S+)", se)
        used = store_used(se)
        problems = []
        if rc != 0:
            problems.append(f"exit code {rc}")
        if len(got) != 2 or len(set(got)) != 1:
            problems.append(f"state checksums {got} (2 equal ones expected)")
        else:
            sums[name] = got[0]
        if not used.startswith(want):
            problems.append(f"bootstrapped through {used}, expected {want} ({why})")
        runs.record(name, "failed" if problems else "ok", t1,
                    error="; ".join(problems) + (f": {tail(se, 2000)}" if problems else ""),
                    exit_code=rc, store=used, checksum=got[0] if got else None,
                    wall_s=round(secs, 3))
    t1 = time.monotonic()
    if len(set(sums.values())) > 1:
        runs.record("cddp-train: one checksum under every launcher", "failed", t1,
                    error=json.dumps(sums))
    elif len(sums) == len(cases):
        runs.record("cddp-train: one checksum under every launcher", "ok", t1)
    return runs.write()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["seed", "seed-gpu", "train"])
    ap.add_argument("--python", required=True, help="the Python whose torch is the oracle")
    ap.add_argument("--cddprun", required=True)
    ap.add_argument("--train", help="cddp-train (train)")
    ap.add_argument("--nproc", type=int, default=4, help="workers (seed)")
    ap.add_argument("--timeout", type=int, default=180, help="seconds for one launch")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.what == "train" and not a.train:
        ap.error("train needs --train PATH")
    # (the launchers run in a folder of their own)
    a.cddprun = os.path.abspath(a.cddprun)
    a.train = a.train and os.path.abspath(a.train)
    return {"seed": cmd_seed, "seed-gpu": cmd_seed_gpu, "train": cmd_train}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
