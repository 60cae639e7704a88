"""cddp-collbench (trainer/comm/) launched by Debian's torchrun 1.13.

torchrun's c10d rendezvous (--standalone) leaves MASTER_PORT to the workers
(TORCHELASTIC_USE_AGENT_STORE=False): our rank 0 serves the bootstrap store
there. Its static rendezvous (the default without --standalone) has the
agent serve torch's own TCPStore on MASTER_PORT (True): the workers use it
through store/tcpstore_client.c.
"""
import os
import pathlib

import pytest

from conftest import binary, free_port, run

TORCHRUN = str(pathlib.Path(__file__).resolve().parent / "torchrun_py311.py")


@pytest.mark.torch
@pytest.mark.heavy
def test_collectives_under_torchrun_standalone(torch_python, tmp_path):
    r = run([torch_python, TORCHRUN, "--standalone", "--nproc_per_node=2", "--no_python",
             binary("cddp-collbench"), "--check", "--init-timeout=60"], timeout=180,
            cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "world 2, gloo:" in r.stdout and "all results right" in r.stdout


@pytest.mark.torch
@pytest.mark.heavy
def test_collectives_under_torchrun_static_agent_store(torch_python, tmp_path):
    r = run([torch_python, TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}",
             "--no_python",
             binary("cddp-collbench"), "--check", "--init-timeout=60"], timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "world 2, gloo:" in r.stdout and "all results right" in r.stdout


@pytest.mark.torch
@pytest.mark.heavy
def test_cddp_train_under_torchrun_static(torch_python, tmp_path):
    """The command a new user types: torch 1.13's static rendezvous hosts a
    TCPStore on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True); cddp-train
    bootstraps through it (it exited 2 before it spoke TCPStore)."""
    tiny = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
            "10", "--epochs", "1", "--log-every", "1", "--num-samples", "16", "--batch-size", "4",
            "--steps", "2"]
    r = run([torch_python, TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}",
             "--no_python", binary("cddp-train"), *tiny], timeout=180, cwd=tmp_path,
            env=dict(os.environ, LOGLEVEL="INFO"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    sums = set(l.rsplit(" ", 1)[1] for l in r.stderr.splitlines()
               if "after 2 steps: state checksum" in l)
    assert len(sums) == 1 and r.stderr.count("after 2 steps: state checksum") == 2, r.stderr
