"""cddp-train's checkpoints, end to end: real trainer processes, real SIGKILLs.

A small deterministic run (ResNet-18 on 24 synthetic 32x32 images, batch 4,
so 6 steps per epoch, 2 epochs, 2 threads, fixed seed) is the reference.
The same run with --checkpoint must end with the same final weights, byte
for byte (--save), however it is interrupted:

  - stopped by --steps inside an epoch, then rerun: it resumes at that exact
    batch (the first lines say so) and ends with the reference's weights; a
    third run finds training finished, trains nothing and saves them again;
  - SIGKILLed after a --ckpt-every checkpoint, mid-run, then rerun;
  - SIGKILLed while writing a checkpoint (the temporary file is still there
    afterwards): the previous checkpoint loads and the rerun still ends with
    the reference's weights.

A damaged newest checkpoint (a flipped bit) sends the rerun to the one
before it (PATH.prev), which still ends with the reference's weights. A
damaged, truncated or foreign file with no previous one to fall back on, or
one from another model, seed or (mid-epoch) batch size, stops the trainer
before any training: exit 1, one line naming the file and the problem, the
file byte for byte as it was.
--no-resume trains from scratch over such a file and replaces it. At an
epoch boundary the batch size may change. Flags that need --checkpoint,
a checkpoint in a missing directory and missing data are usage errors
(exit 2) that leave an existing checkpoint alone.

Small enough to run under ASan too.
"""
import json
import os
import re
import select
import signal
import struct
import subprocess
import time

import pytest

from conftest import binary, run

RUN = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-samples", "24",
       "--batch-size", "4", "--num-classes", "10", "--threads", "2", "--epochs", "2",
       "--seed", "3", "--log-every", "2"]
STEPS = 12  # 6 batches per epoch, 2 epochs


def train(*args, timeout=300, env=None):
    return run([binary("cddp-train")] + RUN + [str(a) for a in args], timeout=timeout, env=env)


def meta_of(path):
    """The safetensors __metadata__ of path (the header alone; no torch needed)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))["__metadata__"]


def read_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's final weights (bytes)."""
    d = tmp_path_factory.mktemp("reference")
    r = train("--save", d / "ref.safetensors")
    assert r.returncode == 0, r.stderr
    assert "resumed" not in r.stdout
    return read_bytes(d / "ref.safetensors")


def test_resume_inside_an_epoch_is_exact(tmp_path, reference):
    ck, out = tmp_path / "ck.safetensors", tmp_path / "out.safetensors"
    r = train("--checkpoint", ck, "--steps", 4)
    assert r.returncode == 0, r.stderr
    m = meta_of(ck)
    assert (m["epoch"], m["step"], m["sampler.epoch_offset"], m["optimizer.steps"]) == \
        ("0", "4", "16", "4"), m
    assert not (tmp_path / "ck.safetensors.tmp").exists()

    r = train("--checkpoint", ck, "--save", out)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"=> resumed from checkpoint '{ck}' (epoch 0, batch 4, step 4)", lines
    assert lines[1].startswith("Epoch 0 [4/6] Loss: "), lines  # the batch after the checkpoint
    assert not any(line.startswith("Epoch 0 [0/6]") for line in lines), lines
    assert read_bytes(out) == reference, "resumed run's final weights differ from the reference"
    m = meta_of(ck)
    assert (m["epoch"], m["step"], m["sampler.epoch_offset"]) == ("2", str(STEPS), "0"), m

    # Finished: a rerun trains nothing and writes the same weights again; the
    # checkpoint replaces --init, which is not even read.
    os.unlink(out)
    r = train("--checkpoint", ck, "--save", out, "--init", tmp_path / "gone.safetensors")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == \
        [f"=> resumed from checkpoint '{ck}' (epoch 2, batch 0, step {STEPS})"], r.stdout
    assert read_bytes(out) == reference


def read_stderr_until(proc, pattern, timeout):
    """Reads proc's stderr (a binary pipe) until a line matches pattern; returns the match."""
    deadline = time.monotonic() + timeout
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"no line matching {pattern!r} within {timeout}s:\n{buf.decode()}")
        ready, _, _ = select.select([proc.stderr], [], [], left)
        if not ready:
            continue
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            pytest.fail(f"trainer exited before {pattern!r}:\n{buf.decode()}")
        buf += chunk
        m = re.search(pattern, buf.decode(errors="replace"))
        if m:
            return m


def start(background, *args, env=None):
    return background([binary("cddp-train")] + RUN + [str(a) for a in args], env=env,
                      stdout=subprocess.DEVNULL, text=False)


def test_sigkill_after_a_checkpoint_resumes_exactly(tmp_path, background, reference):
    ck, out = tmp_path / "ck.safetensors", tmp_path / "out.safetensors"
    env = dict(os.environ, LOGLEVEL="INFO")
    p = start(background, "--checkpoint", ck, "--ckpt-every", 4, env=env)
    # killed as soon as the checkpoint of step 4 (2/3 into epoch 0) has landed
    read_stderr_until(p.proc, r"T0501: checkpoint: step 4,", timeout=120)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    step = int(meta_of(ck)["step"])
    assert step in (4, 6, 8), step  # 4 unless this machine stalled the kill

    r = train("--checkpoint", ck, "--ckpt-every", 4, "--save", out)
    assert r.returncode == 0, r.stderr
    assert re.match(rf"=> resumed from checkpoint '.*' \(epoch \d, batch \d, step {step}\)\n",
                    r.stdout), r.stdout
    assert read_bytes(out) == reference


def test_sigkill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path, background,
                                                                    reference):
    ck, out = tmp_path / "ck.safetensors", tmp_path / "out.safetensors"
    tmp = tmp_path / "ck.safetensors.tmp"
    killed_mid_write = False
    for attempt in range(3):  # the kill can land between two writes; then try again
        p = start(background, "--checkpoint", ck, "--ckpt-every", 1, "--no-resume")
        deadline = time.monotonic() + 120
        # a checkpoint is on disk and the next one is being written
        while not (ck.exists() and tmp.exists()):
            assert p.proc.poll() is None, "trainer exited before its second checkpoint"
            assert time.monotonic() < deadline, "no second checkpoint write within 120s"
            time.sleep(0.001)
        os.killpg(p.pid, signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
        if tmp.exists():
            killed_mid_write = True
            break
    assert killed_mid_write, "three kills all missed a checkpoint write"
    before = int(meta_of(ck)["step"])
    assert 1 <= before < STEPS

    r = train("--checkpoint", ck, "--save", out)
    assert r.returncode == 0, r.stderr
    assert f"step {before})" in r.stdout.splitlines()[0], r.stdout
    assert read_bytes(out) == reference
    assert not tmp.exists()  # the stale temporary file was reused and renamed


def test_damaged_newest_checkpoint_resumes_from_the_previous(tmp_path, reference):
    """PATH.prev is the checkpoint PATH replaced (a hard link, no copy); a
    flipped bit in PATH sends the rerun to it, with one warning, and the run
    still ends with the reference's weights."""
    ck, out = tmp_path / "ck.safetensors", tmp_path / "out.safetensors"
    prev = tmp_path / "ck.safetensors.prev"
    r = train("--checkpoint", ck, "--ckpt-every", 2, "--steps", 8)
    assert r.returncode == 0, r.stderr
    assert (meta_of(ck)["step"], meta_of(prev)["step"]) == ("8", "6")
    blob = bytearray(ck.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    ck.write_bytes(bytes(blob))

    r = train("--checkpoint", ck, "--ckpt-every", 2, "--save", out)
    assert r.returncode == 0, r.stderr
    warn = [line for line in r.stderr.splitlines() if "T0506" in line]
    assert len(warn) == 1 and "corrupt: the data's CRC-32" in warn[0] and str(prev) in warn[0], \
        r.stderr
    assert r.stdout.startswith(f"=> resumed from checkpoint '{prev}' (epoch 1, batch 0, step 6)"), \
        r.stdout
    assert read_bytes(out) == reference
    assert meta_of(ck)["step"] == str(STEPS)  # the damaged file was replaced


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A valid checkpoint 3 steps in (mid-epoch) and the --save weights of that run."""
    d = tmp_path_factory.mktemp("ckpt")
    r = train("--checkpoint", d / "ck.safetensors", "--steps", 3, "--save", d / "w.safetensors")
    assert r.returncode == 0, r.stderr
    return read_bytes(d / "ck.safetensors"), read_bytes(d / "w.safetensors")


def damaged(blob):
    """(name, bytes, message) for each way a checkpoint file can be wrong."""
    (n,) = struct.unpack("<Q", blob[:8])
    flipped = bytearray(blob)
    flipped[8 + n + len(blob[8 + n:]) // 2] ^= 0x01
    return [
        ("truncated", blob[:len(blob) // 2], "truncated"),
        ("header cut", blob[:8 + n // 2], "truncated"),
        ("empty", b"", None),
        ("flipped bit", bytes(flipped), "corrupt: the data's CRC-32"),
        ("not safetensors", b"PK\x03\x04 this is a zip file, not a checkpoint" * 4, None),
    ]


@pytest.mark.parametrize("case", range(5))
def test_damaged_checkpoint_is_refused_and_left_alone(tmp_path, checkpoint, case):
    name, blob, msg = damaged(checkpoint[0])[case]
    ck = tmp_path / "ck.safetensors"
    ck.write_bytes(blob)
    r = train("--checkpoint", ck)
    assert r.returncode == 1, (name, r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cddp-train: --checkpoint: ") and \
        str(ck) in lines[0], (name, r.stderr)
    if msg:
        assert msg in lines[0], (name, lines[0])
    assert "Epoch" not in r.stdout, name  # refused before any training
    assert ck.read_bytes() == blob, f"{name}: the file was modified"
    assert not (tmp_path / "ck.safetensors.tmp").exists()


@pytest.mark.parametrize("args, msg", [
    (["--arch", "resnet34"], "checkpoint of resnet18, but this run trains resnet34"),
    (["--num-classes", "12"], "fc.weight is F32 [10, 512] in the file, F32 [12, 512]"),
    (["--seed", "4"], "--seed 3, this run has --seed 4"),
    (["--batch-size", "6"], "--batch-size 4, this run 6"),
    (["--no-shuffle"], "shuffled, this run --no-shuffle"),
    (["--num-samples", "28"], "24 training samples, this run 28"),
])
def test_mismatched_checkpoint_is_refused_and_left_alone(tmp_path, checkpoint, args, msg):
    ck = tmp_path / "ck.safetensors"
    ck.write_bytes(checkpoint[0])
    r = train("--checkpoint", ck, *args)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(ck) in lines[0] and msg in lines[0], r.stderr
    assert "Epoch" not in r.stdout
    assert ck.read_bytes() == checkpoint[0]


def test_weights_file_is_not_a_checkpoint(tmp_path, checkpoint):
    ck = tmp_path / "w.safetensors"
    ck.write_bytes(checkpoint[1])
    r = train("--checkpoint", ck)
    assert r.returncode == 1 and "not a cddp-train checkpoint" in r.stderr and \
        "--init" in r.stderr, r.stderr
    assert ck.read_bytes() == checkpoint[1]


def test_no_resume_starts_over_and_replaces_the_checkpoint(tmp_path, checkpoint):
    ck, out = tmp_path / "ck.safetensors", tmp_path / "out.safetensors"
    # a checkpoint this run would resume (it is at step 3: there would be
    # nothing left to train), and one it would refuse (corrupt)
    for blob in (checkpoint[0], damaged(checkpoint[0])[3][1]):
        ck.write_bytes(blob)
        r = train("--checkpoint", ck, "--no-resume", "--steps", 3, "--save", out)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("Epoch 0 [0/6] Loss: "), r.stdout  # from the start
        assert read_bytes(out) == checkpoint[1]  # the same 3 steps as the fixture's run
        assert ck.read_bytes() == checkpoint[0]  # rewritten: the same state as the fixture's


def test_batch_size_may_change_at_an_epoch_boundary(tmp_path):
    ck = tmp_path / "ck.safetensors"
    r = train("--checkpoint", ck, "--epochs", 1)
    assert r.returncode == 0, r.stderr
    assert meta_of(ck)["sampler.epoch_offset"] == "0"
    r = train("--checkpoint", ck, "--batch-size", 6)
    assert r.returncode == 0, r.stderr
    assert re.search(r"T0502: .*batch size 4, 24 samples; epoch 1 is laid out for this run: "
                     r"world size 1, batch size 6, 24 samples$", r.stderr, re.M), r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"=> resumed from checkpoint '{ck}' (epoch 1, batch 0, step 6)", lines
    assert lines[1].startswith("Epoch 1 [0/4] Loss: "), lines
    m = meta_of(ck)
    assert (m["epoch"], m["step"], m["sampler.batch_size"]) == ("2", "10", "6"), m


def test_cosine_schedule_resumes_on_its_curve(tmp_path):
    """--lr-schedule cosine: a run that crashed after a checkpoint resumes to
    the same bits as an uninterrupted one (the lr is a function of the
    global step); the checkpoint records the schedule and a resume with
    another one is warned about."""
    ref, ck, out = (tmp_path / f for f in ("ref.safetensors", "ck.safetensors",
                                           "out.safetensors"))
    cos = ["--lr-schedule", "cosine"]
    r = train(*cos, "--save", ref)
    assert r.returncode == 0, r.stderr
    r = train(*cos, "--checkpoint", ck, "--ckpt-every", 4, "--fault", "crash@step=5")
    assert r.returncode == 1, r.stderr
    m = meta_of(ck)
    assert (m["step"], m["optimizer.lr_schedule"], m["optimizer.lr_total_steps"]) == \
        ("4", "cosine", str(STEPS)), m
    r = train(*cos, "--checkpoint", ck, "--save", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == \
        f"=> resumed from checkpoint '{ck}' (epoch 0, batch 4, step 4)"
    assert "T0505" not in r.stderr, r.stderr
    assert read_bytes(out) == read_bytes(ref), "resumed cosine run differs from the reference"
    r = train("--checkpoint", ck)  # constant now: warned, not refused
    assert r.returncode == 0, r.stderr
    assert re.search(r"T0505: .*written with --lr-schedule cosine \(over 12 steps\); continuing "
                     r"with --lr-schedule constant \(over 0 steps\)", r.stderr), r.stderr


@pytest.mark.parametrize("args, flag", [
    (["--ckpt-every", "3"], "--ckpt-every"),
    (["--no-resume"], "--no-resume"),
    (["--checkpoint", "/nonexistent-dir/ck.safetensors"], "/nonexistent-dir"),
    (["--checkpoint", "CK", "--ckpt-every", "0"], "--ckpt-every"),
    (["--checkpoint", "CK", "--save", "CK"], "--checkpoint"),
    (["--checkpoint", "."], "--checkpoint"),
    (["--checkpoint", ""], "--checkpoint"),
])
def test_bad_checkpoint_flags_exit_2(tmp_path, args, flag):
    args = [str(tmp_path / "ck.safetensors") if a == "CK" else a for a in args]
    r = train(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cddp-train: ") and flag in lines[0], r.stderr
    assert r.stdout == ""


def test_missing_data_exits_2_and_leaves_the_checkpoint(tmp_path, checkpoint):
    ck = tmp_path / "ck.safetensors"
    ck.write_bytes(checkpoint[0])
    r = run([binary("cddp-train"), "--arch", "resnet18", "--data", f"idx:{tmp_path}/nowhere",
             "--checkpoint", ck], timeout=60)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "nowhere" in r.stderr, r.stderr
    assert ck.read_bytes() == checkpoint[0]
