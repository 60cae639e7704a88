"""cddprun side by side with the oracle's torchrun (Debian's torch 1.13.1
through tests/compat/torchrun_py311.py, or CDDP_TORCH_PYTHON's, e.g. the
device machine's 2.11, unpatched: conftest.torchrun_cmd()): the same command
under both, compared.

- the workers' environment, key by key, on the first attempt and after a
  failure restart; the only differences allowed are the ones
  docs/torchrun-compat.md documents for the oracle's torch version
  (side_by_side.documented_env);
- tee prefixes and the log directory layout, and --local-ranks-filter
  where the oracle's torchrun has it (torch >= 2.3);
- the failure table and the agent's error file for a worker that raises
  under @record;
- a real PyTorch DDP script (gloo, env://, DistributedSampler, DDP) giving
  byte-identical results;
- exit codes.
"""
import json
import os
import re

import pytest

from conftest import ROOT, binary, free_port, run, torch_info, torchrun_cmd
from side_by_side import env_differences, mask_table

# Same layout, different temporary directory: compared by shape.
ERROR_FILE_RE = r"/logs/cmp_[^/]+/attempt_{attempt}/{lr}/error\.json$"

pytestmark = [pytest.mark.torch, pytest.mark.heavy]


def base_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    # A C locale makes Python 3.11 add LC_CTYPE to its own environment (PEP 538),
    # which torchrun would pass on; a UTF-8 locale keeps the two bases equal.
    env["LC_ALL"] = "C.UTF-8"
    env["TMPDIR"] = str(tmp_path)
    env.update(extra)
    return env


def launch(which, args, env, timeout=300):
    cmd = torchrun_cmd() if which == "torchrun" else [binary("cddprun")]
    return run(cmd + [str(a) for a in args], env=env, timeout=timeout)


def read_env(path):
    return dict(l.split("=", 1) for l in path.read_text().splitlines() if "=" in l)


def test_env_tee_logs_restart_match_torchrun(tmp_path, torch_python):
    worker = tmp_path / "w"
    # Rank 1 fails attempt 0 only once rank 0 has written its env and lines:
    # under load the launcher could otherwise stop rank 0 before it wrote them.
    worker.write_text("""#!/bin/sh
env > "$OUT/.env.$TORCHELASTIC_RESTART_COUNT.$LOCAL_RANK"
mv "$OUT/.env.$TORCHELASTIC_RESTART_COUNT.$LOCAL_RANK" "$OUT/env.$TORCHELASTIC_RESTART_COUNT.$LOCAL_RANK"
echo "hello from $LOCAL_RANK attempt $TORCHELASTIC_RESTART_COUNT"
echo "oops from $LOCAL_RANK" >&2
touch "$OUT/up.$TORCHELASTIC_RESTART_COUNT.$LOCAL_RANK"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$LOCAL_RANK" = 1 ]; then
    i=0; while [ ! -e "$OUT/up.0.0" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done
    exit 1
fi
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 30; fi
exit 0
""")
    worker.chmod(0o755)
    results = {}
    for which in ("torchrun", "cddprun"):
        out = tmp_path / which
        out.mkdir()
        args = ["--nproc_per_node=2", "--max_restarts=1", "--rdzv_id=cmp", "--role=tr",
                f"--master_port={free_port()}", "--monitor_interval=0.1",
                f"--log_dir={out / 'logs'}", "--tee=3", "--no_python", worker]
        r = launch(which, args, base_env(tmp_path, OUT=str(out)))
        assert r.returncode == 0, f"{which}: {r.stderr}"
        results[which] = (out, r)

    (t_out, t_r), (c_out, c_r) = results["torchrun"], results["cddprun"]
    for attempt in (0, 1):
        for lr in (0, 1):
            te = read_env(t_out / f"env.{attempt}.{lr}")
            ce = read_env(c_out / f"env.{attempt}.{lr}")
            # every key equal but the ones docs/torchrun-compat.md documents
            # for this torch version (side_by_side.documented_env)
            diffs = env_differences(te, ce, torch_info(), attempt, lr, ERROR_FILE_RE)
            assert not diffs, f"attempt {attempt} rank {lr}: " + "; ".join(diffs)
            assert ce["TORCHELASTIC_RESTART_COUNT"] == str(attempt)
            assert ce["OMP_NUM_THREADS"] == "1"

    # tee: the same prefixed lines on the same streams (order between ranks may differ)
    def teed(text):
        return sorted(l for l in text.splitlines() if re.match(r"^\[tr\d\]:", l))
    assert teed(t_r.stdout) == teed(c_r.stdout)
    assert "[tr1]:hello from 1 attempt 1" in teed(c_r.stdout)
    assert teed(t_r.stderr) == teed(c_r.stderr)
    assert "[tr0]:oops from 0" in teed(c_r.stderr)

    # log layout: <log_dir>/cmp_<random>/attempt_<n>/<lr>/{stdout,stderr}.log, same files
    assert log_layout(t_out) == log_layout(c_out)


def log_layout(root):
    """Every path under root/logs/cmp_<random>/ with its text (None for a
    folder)."""
    (run_dir,) = (root / "logs").iterdir()
    assert run_dir.name.startswith("cmp_")
    return sorted((str(p.relative_to(run_dir)), p.read_text() if p.is_file() else None)
                  for p in run_dir.rglob("*"))


def test_local_ranks_filter_matches_torchrun(tmp_path, torch_python):
    """--local-ranks-filter: the console shows only the listed local ranks,
    teed (prefixed) or inherited; the log files keep every rank's lines."""
    info = torch_info()
    if not info["local_ranks_filter"]:
        pytest.skip(f"torch {info['torch']}'s torchrun has no --local-ranks-filter "
                    "(torch 2.3 added it)")
    worker = tmp_path / "w"
    worker.write_text('#!/bin/sh\necho "hello from $LOCAL_RANK"\n'
                      'echo "oops from $LOCAL_RANK" >&2\n')
    worker.chmod(0o755)

    def lines(text):
        return sorted(l for l in text.splitlines()
                      if re.match(r"^(\[tr\d\]:)?(hello|oops) from", l))

    for extra, ranks, want in ((["--tee=3"], "0,2", ["[tr0]:hello from 0", "[tr2]:hello from 2"]),
                               ([], "1", ["hello from 1"])):
        seen = {}
        for which in ("torchrun", "cddprun"):
            out = tmp_path / f"{which}-{ranks}"
            out.mkdir()
            r = launch(which, ["--nproc_per_node=3", "--rdzv_id=cmp", "--role=tr",
                               f"--master_port={free_port()}", "--monitor_interval=0.1",
                               f"--log_dir={out / 'logs'}", f"--local_ranks_filter={ranks}",
                               *extra, "--no_python", worker], base_env(tmp_path))
            assert r.returncode == 0, f"{which}: {r.stderr}"
            seen[which] = (lines(r.stdout), lines(r.stderr), log_layout(out))
        assert seen["cddprun"] == seen["torchrun"], (ranks, seen)
        assert seen["cddprun"][0] == want, (ranks, seen["cddprun"][0])


RAISER = """
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("the worker failed on purpose")

if __name__ == "__main__":
    main()
"""


def test_failure_table_and_error_file_match_torchrun(tmp_path, torch_python):
    script = tmp_path / "raiser.py"
    script.write_text(RAISER)
    tables, files = {}, {}
    for which in ("torchrun", "cddprun"):
        agent_file = tmp_path / f"{which}.error.json"
        r = launch(which, ["--nproc_per_node=1", f"--master_port={free_port()}",
                           "--monitor_interval=0.1", script],
                   base_env(tmp_path, TORCHELASTIC_ERROR_FILE=str(agent_file)))
        assert r.returncode == 1, f"{which}: {r.stderr}"
        tables[which] = mask_table(r.stderr)
        files[which] = json.loads(agent_file.read_text())
    assert tables["cddprun"] == tables["torchrun"], "\n".join(
        ["torchrun:"] + tables["torchrun"] + ["cddprun:"] + tables["cddprun"])
    assert any("ValueError: the worker failed on purpose" in l for l in tables["cddprun"])
    t, c = files["torchrun"]["message"], files["cddprun"]["message"]
    assert c["message"] == t["message"] == "ValueError: the worker failed on purpose"
    assert c["errorCode"] == t["errorCode"] == 1
    assert set(c["extraInfo"]) == set(t["extraInfo"])


def test_ddp_script_same_results(tmp_path, torch_python):
    script = ROOT / "tests" / "compat" / "ddp_train.py"
    results = {}
    for which in ("torchrun", "cddprun"):
        out = tmp_path / which
        out.mkdir()
        r = launch(which, ["--nproc_per_node=2", f"--master_port={free_port()}",
                           "--monitor_interval=0.1", script, "--out", out],
                   base_env(tmp_path), timeout=600)
        assert r.returncode == 0, f"{which}: {r.stderr}"
        results[which] = json.loads((out / "result.json").read_text())
        assert (out / "checkpoint.pt").stat().st_size > 0
    t, c = results["torchrun"], results["cddprun"]
    assert c["world_size"] == 2
    assert c["losses"] == t["losses"]
    assert c["weights_sha256"] == t["weights_sha256"]
    for k, v in t["env"].items():
        if k != "MASTER_PORT":
            assert c["env"][k] == v, k


def test_bad_flag_exit_code_matches_torchrun(tmp_path, torch_python):
    for which in ("torchrun", "cddprun"):
        r = launch(which, ["--nproc_per_node=2", "--no_such_flag", "x.py"], base_env(tmp_path))
        assert r.returncode == 2, f"{which}: {r.returncode} {r.stderr}"
