"""Goodput end to end (docs/status.md, "Goodput"): cddp-train under cddprun,
2 ranks on the CPU, a checkpoint every 4 steps and rank 0 (the one that writes
checkpoints, so none is written when the group is stopped) crashing at step
7. The restart resumes from step 4's checkpoint, so the steps computed after
it in the first attempt were redone: the agent's lost steps must be exactly
the highest step the first attempt logged minus the step the second one
resumed from (both read from the workers' own logs, not from the agent),
and its phases must add up to its wall time. The final /status (served
while the agent lingers) also carries the exit code.
"""
import glob
import os
import re
import signal
import subprocess
import time

from conftest import agent_status as status, binary, free_port, wait_for

ARGS = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
        "10", "--epochs", "1", "--log-every", "1", "--num-samples", "64", "--batch-size", "4",
        "--ckpt-every", "4", "--fault", "crash@step=7,rank=0"]
PHASES = {"init", "productive", "lost", "restart", "rendezvous", "stopped"}


def steps_logged(tmp_path, attempt):
    """The steps the workers of one attempt logged (T0002: 'step N loss ...')."""
    out = []
    for f in glob.glob(str(tmp_path / "logs" / "*" / f"attempt_{attempt}" / "*" / "stderr.log")):
        out += [int(m) for m in re.findall(r"T0002: step (\d+) loss", open(f).read())]
    return out


def test_crash_and_resume_counts_the_redone_steps(background, tmp_path):
    port = free_port()
    env = dict(os.environ, LOGLEVEL="DEBUG")
    t0 = time.monotonic()
    with open(tmp_path / "err", "w") as err, open(tmp_path / "out", "w") as out:
        p = background([binary("cddprun"), "--nproc_per_node=2", "--standalone",
                        "--max_restarts=1", "--redirects=3", f"--log_dir={tmp_path / 'logs'}",
                        f"--status_port={port}", "--status_linger=60", binary("cddp-train"),
                        *ARGS, "--checkpoint", str(tmp_path / "ck.safetensors")],
                       env=env, stdout=out, stderr=err)
        st = {}
        wait_for(lambda: (st.update(status(port) or {}) or st.get("exit_code") is not None),
                 timeout=150, what="the run's end on /status")
        ran = time.monotonic() - t0
        ctl = subprocess.run([binary("cddpctl"), "status", f"127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=30)
        p.signal(signal.SIGTERM)  # ends the linger; the exit status is the run's
        assert p.wait(20) == 0
    text = (tmp_path / "err").read_text()
    assert (st["exit_code"], st["exit_reason"]) == (0, "success"), text[-3000:]

    high = max(steps_logged(tmp_path, 0))
    second = steps_logged(tmp_path, 1)
    resumed = re.findall(r"resumed from checkpoint .* step (\d+)\)",
                         "".join(open(f).read() for f in glob.glob(
                             str(tmp_path / "logs" / "*" / "attempt_1" / "*" / "stdout.log"))))
    assert resumed and set(resumed) == {"4"}, second
    assert min(second) == 5 and high >= 6, (high, second)  # redone: 5..high

    g = st["goodput"]
    assert g["lost_steps"] == high - 4, (g, high)
    assert set(g["seconds"]) == PHASES
    assert abs(sum(g["seconds"].values()) - g["wall_s"]) < 0.01, g
    assert abs(g["wall_s"] - ran) < 2.5, (g, ran)  # the agent's life, as the test saw it
    s = g["seconds"]
    assert s["productive"] > 0 and s["lost"] > 0 and s["restart"] > 0 and s["init"] > 0, g
    assert abs(g["ratio"] - s["productive"] / g["wall_s"]) < 1e-3, g
    assert g["phase"] == "stopped"

    # cddpctl status shows it, and the exit code
    assert ctl.returncode == 0, ctl.stderr
    row = re.search(r"^goodput +(\d+\.\d)% of \S+: \S+ productive, \S+ lost \((\d+) steps?\)",
                    ctl.stdout, re.M)
    assert row and int(row.group(2)) == high - 4, ctl.stdout
    assert abs(float(row.group(1)) - 100 * g["ratio"]) <= 0.1, (row.group(0), g)
    assert re.search(r"^exit +0 \(success\)$", ctl.stdout, re.M), ctl.stdout

    # the summary line at exit says the same
    line = [ln for ln in text.splitlines() if "A0420" in ln]
    assert len(line) == 1, text[-3000:]
    lost = high - 4
    assert re.search(rf"goodput \d+\.\d% of [\d.,]+ s: [\d.,]+ s productive, .*"
                     rf"redoing {lost} step{'s' if lost != 1 else ''}", line[0]), line[0]
