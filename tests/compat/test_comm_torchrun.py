"""cddp-collbench and cddp-train (trainer/comm/) launched by the oracle's torchrun.

Which store the workers bootstrap through depends on the rendezvous and on
the torch version, and each test says which one it expects:

- torchrun's static rendezvous (the default without --standalone) has the
  agent serve torch's own TCPStore on MASTER_PORT
  (TORCHELASTIC_USE_AGENT_STORE=True) in every version: the workers use it
  through store/tcpstore_client.c;
- its c10d rendezvous (--standalone) does the same from torch 2.4
  (pytorch#128096: the agent's store is shared, by torch 2.x's libuv
  server); torch 1.13's leaves MASTER_PORT to the workers
  (TORCHELASTIC_USE_AGENT_STORE=False), and our rank 0 serves the
  bootstrap store there.

With LOGLEVEL=DEBUG the workers say which it was (T6031, with the TCPStore
dialect, or T6021 for our own bootstrap store): side_by_side.store_used()
reads it and expected_store() says what each version should give.
"""
import os

import pytest

from conftest import binary, free_port, run, torch_info, torchrun_cmd
from side_by_side import expected_store, store_used


@pytest.mark.torch
@pytest.mark.heavy
def test_collectives_under_torchrun_standalone(torch_python, tmp_path):
    r = run(torchrun_cmd() + ["--standalone", "--nproc_per_node=2", "--no_python",
                              binary("cddp-collbench"), "--check", "--init-timeout=60"],
            timeout=180, cwd=tmp_path, env=dict(os.environ, LOGLEVEL="DEBUG"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "world 2, gloo:" in r.stdout and "all results right" in r.stdout
    # torch >= 2.4: c10d shares the agent's store; 1.13: rank 0 serves ours.
    assert store_used(r.stderr) == expected_store(torch_info(), "c10d"), r.stderr[-3000:]


@pytest.mark.torch
@pytest.mark.heavy
def test_collectives_under_torchrun_static_agent_store(torch_python, tmp_path):
    r = run(torchrun_cmd() + ["--nproc_per_node=2", f"--master_port={free_port()}", "--no_python",
                              binary("cddp-collbench"), "--check", "--init-timeout=60"],
            timeout=180, cwd=tmp_path, env=dict(os.environ, LOGLEVEL="DEBUG"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "world 2, gloo:" in r.stdout and "all results right" in r.stdout
    assert store_used(r.stderr) == expected_store(torch_info(), "static"), r.stderr[-3000:]


@pytest.mark.torch
@pytest.mark.heavy
def test_cddp_train_under_torchrun_static(torch_python, tmp_path):
    """The command a new user types: torchrun's static rendezvous hosts a
    TCPStore on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True); cddp-train
    bootstraps through it (it exited 2 before it spoke TCPStore)."""
    tiny = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
            "10", "--epochs", "1", "--log-every", "1", "--num-samples", "16", "--batch-size", "4",
            "--steps", "2"]
    r = run(torchrun_cmd() + ["--nproc_per_node=2", f"--master_port={free_port()}",
                              "--no_python", binary("cddp-train"), *tiny], timeout=180,
            cwd=tmp_path, env=dict(os.environ, LOGLEVEL="DEBUG"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    sums = set(l.rsplit(" ", 1)[1] for l in r.stderr.splitlines()
               if "after 2 steps: state checksum" in l)
    assert len(sums) == 1 and r.stderr.count("after 2 steps: state checksum") == 2, r.stderr
    assert store_used(r.stderr) == expected_store(torch_info(), "static"), r.stderr[-3000:]
