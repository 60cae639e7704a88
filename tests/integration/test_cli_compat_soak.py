"""The --run_path soak: how often a 4-rank gloo tcp:// init script aborts at
exit ("terminate called without an active exception") under cddprun
--run_path, against torchrun (Debian's 1.13, tests/compat/torchrun_py311.py).

Not part of the suite: it runs only when CDDP_SOAK_SECONDS is set (the
machine time to spend, shared round-robin by the launchers), and prints one
line per launcher: runs, aborts, other failures. CDDP_SOAK_BEFORE may name
an older cddprun binary to soak beside this build's (the figures in
docs/torchrun-compat.md compare the bootstrap before and after it ended
through os._exit).

    CDDP_SOAK_SECONDS=600 CDDP_SOAK_BEFORE=/tmp/cddprun-before \\
      CDDP_BUILD_DIR=$PWD/build /usr/bin/python3 -m pytest -q -s \\
      tests/integration/test_cli_compat_soak.py
"""
import os
import pathlib
import subprocess
import textwrap
import time

import pytest

BUILD = pathlib.Path(os.environ.get("CDDP_BUILD_DIR", "build")).resolve()
CDDPRUN = pathlib.Path(os.environ.get("CDDP_SOAK_AFTER", BUILD / "launcher" / "cddprun"))
TORCHRUN = pathlib.Path(__file__).resolve().parent.parent / "compat" / "torchrun_py311.py"
PY = "/usr/bin/python3"

SCRIPT = textwrap.dedent("""\
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://%s:%s" % (
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert t.tolist() == [10.0] * 4, t
    # One write(2): four workers share the launcher's stdout.
    os.write(1, b"rank %d done\\n" % dist.get_rank())
    """)


@pytest.mark.heavy
def test_soak_run_path(tmp_path):
    seconds = float(os.environ.get("CDDP_SOAK_SECONDS", "0"))
    if seconds <= 0:
        pytest.skip("the soak runs only with CDDP_SOAK_SECONDS set")
    script = tmp_path / "init.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "LOGLEVEL": "ERROR"}
    launchers = {"cddprun --run_path (this build)": [str(CDDPRUN), "--run_path"]}
    before = os.environ.get("CDDP_SOAK_BEFORE")
    if before:
        launchers["cddprun --run_path (before)"] = [before, "--run_path"]
    launchers["torchrun --run_path (1.13)"] = [PY, str(TORCHRUN), "--run_path"]
    counts = {k: [0, 0, 0] for k in launchers}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, cmd in launchers.items():
            r = subprocess.run(cmd + ["--standalone", "--nproc_per_node=4", str(script)],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            c = counts[name]
            c[0] += 1
            if "terminate called" in r.stderr:
                c[1] += 1
            elif r.returncode != 0 or r.stdout.count("done\n") != 4:
                c[2] += 1
                print(f"\n{name}: exit {r.returncode}\n{r.stderr[-2000:]}")
    for name, (runs, aborts, other) in counts.items():
        print(f"\nSOAK {name}: {runs} runs, {aborts} aborted at exit, {other} other failures")
