"""The agent's TCPStore (--agent_store, default true; docs/torchrun-compat.md).

Real processes, torch 1.13 as the client: node 0's agent serves torch's
TCPStore on MASTER_ADDR:MASTER_PORT before any worker starts, a fresh one
each round, and its workers get TORCHELASTIC_USE_AGENT_STORE=True;
--agent_store=false keeps the workers' rank 0 serving (False).
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import TORCH_PY, binary, free_port, run

TINY = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
        "10", "--epochs", "1", "--log-every", "1", "--num-samples", "16", "--batch-size", "4",
        "--steps", "2"]

CLIENT = r"""
import datetime, os, sys
import torch.distributed as dist
r = int(os.environ["RANK"]); w = int(os.environ["WORLD_SIZE"])
os.write(1, f"USE_AGENT_STORE {os.environ['TORCHELASTIC_USE_AGENT_STORE']}\n".encode())
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                  timeout=datetime.timedelta(seconds=20))
s.set(f"k{r}", b"v%d" % r)
n = s.add("count", 1)
s.wait([f"k{p}" for p in range(w)])
got = [s.get(f"k{p}") for p in range(w)]
assert got == [b"v%d" % p for p in range(w)], got
try:
    s.wait(["never"], datetime.timedelta(milliseconds=300))
    sys.exit("wait did not time out")
except RuntimeError:
    pass
os.write(1, f"OK {r} {n}\n".encode())  # one write: lines of two ranks never mix
"""

SEED = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
os.write(1, f"SUM {int(t.item())} {os.environ['TORCHELASTIC_USE_AGENT_STORE']}\n".encode())
dist.destroy_process_group()
"""

# Attempt 0: rank 0 writes a key, then rank 1 fails; attempt 1 must not see it.
RESTART = r"""
import datetime, os, sys
import torch.distributed as dist
a = int(os.environ["TORCHELASTIC_RESTART_COUNT"]); r = int(os.environ["RANK"])
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                  timeout=datetime.timedelta(seconds=20))
if a == 0:
    if r == 0:
        s.set("stale", b"from attempt 0")
        s.set("written", b"1")
        s.wait(["never"])  # stopped by the agent when rank 1 fails
    s.wait(["written"])
    sys.exit(3)
try:
    s.wait(["stale"], datetime.timedelta(milliseconds=500))
    seen = "present"
except RuntimeError:
    seen = "absent"
os.write(1, f"ATTEMPT1 {r} {seen}\n".encode())
"""


def script(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def cddprun(*args, env=None, timeout=120):
    e = dict(os.environ, PYTHON_EXEC=TORCH_PY, LOGLEVEL="INFO")
    e.update(env or {})
    return run([binary("cddprun"), *map(str, args)], env=e, timeout=timeout)


pytestmark = pytest.mark.torch


def test_torch_client_against_the_agent_store(tmp_path, torch_python):
    port = free_port()
    r = cddprun("--nproc_per_node=2", f"--master_port={port}", script(tmp_path, "c.py", CLIENT))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("USE_AGENT_STORE True") == 2
    assert sorted(re.findall(r"OK \d+ (\d+)", r.stdout)) == ["1", "2"], r.stdout
    assert f"A0801: [default] the agent's TCPStore serves round 1 on 127.0.0.1:{port}" in r.stderr
    assert "A0802" in r.stderr


def test_torch_client_agent_store_env_off(tmp_path, torch_python):
    # CDDP_AGENT_STORE=false: nobody serves MASTER_PORT until a rank does.
    r = cddprun("--nproc_per_node=1", f"--master_port={free_port()}",
                script(tmp_path, "e.py", "import os; print('UAS', os.environ['TORCHELASTIC_USE_AGENT_STORE'])"),
                env={"CDDP_AGENT_STORE": "false"})
    assert r.returncode == 0, r.stderr
    assert "UAS False" in r.stdout and "A0801" not in r.stderr


@pytest.mark.parametrize("flag,want", [("--agent_store=true", "True"),
                                       ("--agent_store=false", "False")])
def test_seed_script_env_init(tmp_path, torch_python, flag, want):
    r = cddprun("--nproc_per_node=2", f"--master_port={free_port()}", flag,
                script(tmp_path, "seed.py", SEED))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(f"SUM 3 {want}") == 2, r.stdout


@pytest.mark.parametrize("flag", ["--agent_store=true", "--agent_store=false"])
def test_cddp_train_under_cddprun(tmp_path, flag):
    r = cddprun("--nproc_per_node=2", "--standalone", flag, binary("cddp-train"), *TINY)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("after 2 steps: state checksum") == 2
    assert ("A0801" in r.stderr) == flag.endswith("true")


def test_no_key_of_the_previous_round(tmp_path, torch_python):
    r = cddprun("--nproc_per_node=2", f"--master_port={free_port()}", "--max_restarts=1",
                script(tmp_path, "r.py", RESTART))
    assert r.returncode == 0, r.stdout + r.stderr
    # "stale" is gone: attempt 1 has a fresh store.
    assert sorted(re.findall(r"ATTEMPT1 (\d) (\w+)", r.stdout)) == [("0", "absent"),
                                                                    ("1", "absent")], r.stdout
    assert "A0802: [default] closed the agent's TCPStore" in r.stderr
    assert "a new round" in r.stderr


def test_two_agents_c10d(tmp_path, torch_python):
    port = free_port()
    c = script(tmp_path, "c.py", CLIENT)
    env = dict(os.environ, PYTHON_EXEC=TORCH_PY, LOGLEVEL="INFO")
    args = [binary("cddprun"), "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=as2"]
    procs = [subprocess.Popen(args + [f"--rdzv_conf=is_host={1 - i}", c], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    allout = outs[0][0] + outs[1][0]
    assert sorted(re.findall(r"OK \d+ (\d+)", allout)) == ["1", "2", "3", "4"], allout
    hosts = [("A0801" in err) for _, err in outs]
    assert hosts.count(True) == 1, [e for _, e in outs]  # node 0 only
