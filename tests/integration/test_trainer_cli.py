"""cddp-train's command line and output, on tiny synthetic runs.

Bad flags and missing data exit 2 with one line on stderr that names the
flag or the problem; a run prints the seed script's lines; --steps stops
early; --eval prints the accuracy; --save writes a torchvision state_dict
that --init reads back, and --init refuses a file that does not fit.
Small enough (ResNet-18, 32x32, a few images) to run under ASan too.
"""
import os
import re

import pytest

from conftest import binary, run

TINY = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-samples", "12",
        "--batch-size", "4", "--num-classes", "10", "--threads", "2"]


def train(*args, timeout=300, env=None):
    r = run([binary("cddp-train")] + [str(a) for a in args], timeout=timeout, env=env)
    # under ASan/UBSan a leak or UB report on any path, the error paths included, fails
    assert "Sanitizer" not in r.stderr and "runtime error:" not in r.stderr, r.stderr
    return r


@pytest.mark.parametrize("args, flag", [
    (["--arch", "resnet19"], "--arch"),
    (["--batch-size", "0"], "--batch-size"),
    (["--batch-size", "12x"], "--batch-size"),
    (["--lr", "fast"], "--lr"),
    (["--lr", "-1"], "--lr"),
    (["--lr-schedule", "linear"], "--lr-schedule"),
    (["--momentum", "1.5"], "--momentum"),
    (["--weight-decay", "nan"], "--weight-decay"),
    (["--epochs", "0"], "--epochs"),
    (["--steps", "-3"], "--steps"),
    (["--threads", "0"], "--threads"),
    (["--log-every", ""], "--log-every"),
    (["--image-size", "99999"], "--image-size"),
    (["--seed", "-1"], "--seed"),
    (["--no-such-flag"], "--no-such-flag"),
    (["--eval-logits", "x.safetensors"], "--eval-logits"),
    (["--lr"], "--lr"),
    (["stray"], "stray"),
    (["--eval-limit", "10"], "--eval-limit"),
    (["--accum-steps", "0"], "--accum-steps"),
    (["--bucket-cap-mb", "0"], "--bucket-cap-mb"),
    (["--collective-timeout", "soon"], "--collective-timeout"),
    (["--init-timeout", "-1"], "--init-timeout"),
    (["--fault", "explode@step=1"], "--fault"),
    (["--fault", "slow@step=1"], "--fault"),
    # output paths are checked before training, not at the end of it
    (["--save", "/nonexistent-dir/w.safetensors"], "--save"),
    (["--eval", "--eval-logits", "/nonexistent-dir/l.safetensors"], "--eval-logits"),
])
def test_bad_flags_exit_2_naming_the_flag(args, flag):
    r = train(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("cddp-train: ") and flag in lines[0], lines[0]
    assert r.stdout == ""


def test_missing_data_exits_2(tmp_path):
    r = train("--data", f"idx:{tmp_path}/nowhere", "--steps", "1")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "nowhere" in r.stderr, r.stderr
    r = train("--data", "imagenet", "--steps", "1")
    assert r.returncode == 2 and "imagenet" in r.stderr, r.stderr


def test_batch_norm_needs_two_values(tmp_path):
    # 32x32 leaves a 1x1 map in layer4: a batch of one cannot train batch norm.
    r = train(*TINY, "--batch-size", "1", "--steps", "1")
    assert r.returncode == 2 and "--batch-size" in r.stderr, r.stderr


def test_help_and_version():
    r = train("--help")
    assert r.returncode == 0 and "--arch" in r.stdout and "--batch-size" in r.stdout
    r = train("--version")
    assert r.returncode == 0 and r.stdout.startswith("cddp-train ")


def test_output_reads_as_the_seed_script():
    r = train(*TINY, "--epochs", "2", "--log-every", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # 12 samples, batch 4: 3 batches per epoch, logged at batch 0 and 2
    want = [r"Epoch 0 \[0/3\] Loss: \d+\.\d{4}", r"Epoch 0 \[2/3\] Loss: \d+\.\d{4}",
            r"Epoch 0 finished, avg loss: \d+\.\d{4}, time: \d+\.\d{2}s, throughput: "
            r"\d+\.\d img/s",
            r"Epoch 1 \[0/3\] Loss: \d+\.\d{4}", r"Epoch 1 \[2/3\] Loss: \d+\.\d{4}",
            r"Epoch 1 finished, avg loss: \d+\.\d{4}, time: \d+\.\d{2}s, throughput: "
            r"\d+\.\d img/s"]
    assert len(lines) == len(want), r.stdout
    for line, pattern in zip(lines, want):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_steps_stop_early_and_eval_prints_accuracy():
    env = dict(os.environ, LOGLEVEL="DEBUG")
    r = train(*TINY, "--epochs", "5", "--steps", "4", "--eval", env=env)
    assert r.returncode == 0, r.stderr
    steps = re.findall(r"T0002: step (\d+) loss", r.stderr)
    assert steps == ["1", "2", "3", "4"], r.stderr
    # 3 batches per epoch: epoch 0 whole, epoch 1 cut after its first batch
    assert re.search(r"^Epoch 1 finished", r.stdout, re.M), r.stdout
    assert not re.search(r"^Epoch 2", r.stdout, re.M), r.stdout
    acc = re.findall(r"^test accuracy: (0\.\d{4}|1\.0000)$", r.stdout, re.M)
    assert len(acc) == 1, r.stdout


def test_same_seed_same_losses_other_seed_differs():
    env = dict(os.environ, LOGLEVEL="DEBUG")
    losses = []
    for seed in (7, 7, 8):
        r = train(*TINY, "--steps", "2", "--seed", seed, env=env)
        assert r.returncode == 0, r.stderr
        losses.append(re.findall(r"T0002: step \d+ loss (\S+)", r.stderr))
    assert losses[0] == losses[1] and len(losses[0]) == 2
    assert losses[0] != losses[2]


def test_save_then_init_round_trip(tmp_path):
    w = tmp_path / "w.safetensors"
    r = train(*TINY, "--steps", "1", "--save", w)
    assert r.returncode == 0, r.stderr
    assert w.stat().st_size > 40_000_000  # 11.2 M parameters
    # lr 0: the weights do not move, the BN running statistics and counters do
    w2 = tmp_path / "w2.safetensors"
    r = train(*TINY, "--steps", "1", "--init", w, "--lr", "0", "--weight-decay", "0",
              "--save", w2)
    assert r.returncode == 0, r.stderr
    assert w2.stat().st_size == w.stat().st_size


def test_init_refuses_files_that_do_not_fit(tmp_path):
    w = tmp_path / "w.safetensors"
    assert train(*TINY, "--steps", "1", "--save", w).returncode == 0
    r = train(*TINY, "--arch", "resnet34", "--steps", "1", "--init", w)
    assert r.returncode != 0 and "--init" in r.stderr and "missing" in r.stderr, r.stderr
    r = train(*TINY, "--num-classes", "11", "--steps", "1", "--init", w)
    assert r.returncode != 0 and "fc.weight" in r.stderr, r.stderr
    r = train(*TINY, "--steps", "1", "--init", tmp_path / "absent.safetensors")
    assert r.returncode != 0 and "absent.safetensors" in r.stderr, r.stderr
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    r = train(*TINY, "--steps", "1", "--init", junk)
    assert r.returncode != 0 and "junk.safetensors" in r.stderr, r.stderr
