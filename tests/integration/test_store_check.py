"""tools/store-check, the device machine's check of torch 2.x's TCPStore
client against cddp's server: here (torch 1.13) it must skip with one clear
line, and its checks must pass when run with 1.13 anyway (--allow-torch1),
so the script itself is known to work before it reaches a torch 2.x."""
import os
import subprocess

import pytest

from conftest import ROOT, TORCH_PY, binary

pytestmark = pytest.mark.torch
SCRIPT = str(ROOT / "tools" / "store-check")


def check(*args, env=None):
    return subprocess.run([TORCH_PY, SCRIPT, "--server", binary("cddp-tcpstore"), *args],
                          capture_output=True, text=True, timeout=600, env=env)


def test_skips_below_torch_2(torch_python):
    r = check()
    assert r.returncode == 77, r.stdout + r.stderr
    assert "store-check: skipped: torch 1.13" in r.stdout and "older than 2" in r.stdout


@pytest.mark.heavy
def test_checks_pass_with_torch_1(torch_python, tmp_path):
    r = check("--allow-torch1", env=dict(os.environ, OUT=str(tmp_path)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gloo init_process_group: ok" in r.stdout
    assert "200 clients: ok" in r.stdout
    md = (tmp_path / "store-check.md").read_text()
    assert "| server still up, exits 0 on SIGTERM | ok |" in md, md
