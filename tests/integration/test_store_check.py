"""tools/store-check, the device machine's check of torch 2.x's TCPStore
client against cddp's server: here (torch 1.13) it must skip with one clear
line, and its checks must pass when run with 1.13 anyway (--allow-torch1),
so the script itself is known to work before it reaches a torch 2.x: that
one runs as torch-check's store part (test_torch_check.py)."""
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


# Its checks passing with torch 1.13 (--allow-torch1 against cddp-tcpstore:
# 200 clients, gloo init_process_group, the server up and exiting 0 on
# SIGTERM) are asserted by test_torch_check.py's test_parts_pass_with_torch_1,
# whose store part runs exactly that (and again against torch's own server).
