#!/usr/bin/env python3
"""The --run_path soak: how often a 4-rank gloo tcp:// init script aborts at
exit under cddprun --run_path, against torchrun, side by side in one run.

    /usr/bin/python3 tests/bench/bench_run_path_soak.py [--build build] [--seconds 600]
        [--before /tmp/cddprun-before]

The script (tests/compat/gloo_tcp_init.py) joins a gloo group through
init_method="tcp://...", all-reduces, prints one line and ends without
destroy_process_group, under --standalone --nproc_per_node=4 --run_path.
The launchers take turns until --seconds have passed, so they share the
machine's load: this build's cddprun, an older cddprun named by --before
(docs/torchrun-compat.md compares the bootstrap before and after it ended
through os._exit), and Debian's torchrun 1.13 (tests/compat/torchrun_py311.py).

It prints one line per launcher: runs, runs aborted at exit (stderr holds
"terminate called"), other failed runs (with that run's stderr). It never
passes or fails on them; tests/integration/test_cli_compat.py asserts that
one run of the script under cddprun --run_path succeeds.
"""
import argparse
import os
import pathlib
import platform
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
PY = "/usr/bin/python3"
SCRIPT = ROOT / "tests" / "compat" / "gloo_tcp_init.py"
TORCHRUN = ROOT / "tests" / "compat" / "torchrun_py311.py"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--seconds", type=float, default=600, help="machine time, all launchers")
    ap.add_argument("--before", help="an older cddprun binary to soak beside this build's")
    a = ap.parse_args()
    cddprun = pathlib.Path(a.build).resolve() / "launcher" / "cddprun"
    launchers = {"cddprun --run_path (this build)": [str(cddprun), "--run_path"]}
    if a.before:
        launchers["cddprun --run_path (before)"] = [a.before, "--run_path"]
    launchers["torchrun --run_path (1.13)"] = [PY, str(TORCHRUN), "--run_path"]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "LOGLEVEL": "ERROR",
           "PYTHON_EXEC": PY}
    print(f"# --run_path soak, {time.strftime('%Y-%m-%d %H:%M %Z')}, {a.seconds:.0f} s")
    print(f"# machine: {platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    counts = {k: [0, 0, 0] for k in launchers}
    end = time.monotonic() + a.seconds
    with tempfile.TemporaryDirectory(prefix="cddp-soak-") as cwd:
        while time.monotonic() < end:
            for name, cmd in launchers.items():
                r = subprocess.run(cmd + ["--standalone", "--nproc_per_node=4", str(SCRIPT)],
                                   cwd=cwd, env=env, capture_output=True, text=True,
                                   timeout=300)
                c = counts[name]
                c[0] += 1
                if "terminate called" in r.stderr:
                    c[1] += 1
                elif r.returncode != 0 or r.stdout.count("done\n") != 4:
                    c[2] += 1
                    print(f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}", flush=True)
    print()
    print("| launcher | runs | aborted at exit | other failures |")
    print("|---|---|---|---|")
    for name, (runs, aborts, other) in counts.items():
        print(f"| {name} | {runs} | {aborts} | {other} |")


if __name__ == "__main__":
    main()
