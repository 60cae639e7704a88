"""cddp-train's --prefetch: a loader thread reads batches ahead; results are
the synchronous path's (--prefetch 0), bit for bit.

On tiny CPU runs (ResNet-18, 32x32):
  - every step's loss (T0002, 9 digits), the final state checksum (T6202)
    and the test accuracy are the same with --prefetch 0, 1, 2 and the
    default (0 on the CPU), over two shuffled epochs whose last batch is short, and with
    --accum-steps 2 (a short last step too);
  - a run stopped by --steps inside an epoch and resumed from --checkpoint
    with the loader on ends with the synchronous run's weights, byte for
    byte, and logs the same losses after the resume point;
  - a corrupt JPEG in a folder dataset stops the run with the same one
    line, the same exit code and after the same steps as without the
    loader: when the step loop reaches its batch, not when the loader
    reads it (it reads it earlier);
  - SIGTERM with --checkpoint while the loader runs: the stop handler
    (main thread; the loader blocks the signal) saves the step and the
    process dies by SIGTERM; the resumed run ends with the same weights;
  - the end of training reports the wait for input (T2600).
On a GPU (skipped without one): the same losses with the pinned uploads
on the copy stream as with --prefetch 0, and the default there is 2.
Small enough to run under ASan too (a leak or a race report fails).
"""
import os
import pathlib
import re
import shutil
import signal
import subprocess

import pytest

from conftest import BUILD, binary, run, wait_for

TINY = ["--arch", "resnet18", "--image-size", "32", "--batch-size", "4", "--num-classes", "10",
        "--threads", "2", "--seed", "5", "--log-every", "1"]
DEBUG = dict(os.environ, LOGLEVEL="DEBUG")


def train(*args, timeout=300):
    r = run([binary("cddp-train")] + TINY + [str(a) for a in args], timeout=timeout, env=DEBUG)
    assert "Sanitizer" not in r.stderr and "runtime error:" not in r.stderr, r.stderr
    return r


def losses(r):
    return re.findall(r"T0002: step (\d+) loss (\S+)", r.stderr)


def checksum(r):
    return re.findall(r"T6202: after (\d+) steps: state checksum (\w+)", r.stderr)


def test_losses_identical_with_and_without_the_loader():
    # 10 samples in batches of 4: 3 per epoch, the last of 2; shuffled
    base = ["--data", "synthetic", "--num-samples", "10", "--epochs", "2", "--eval",
            "--eval-limit", "10"]
    runs = {p: train(*base, *(["--prefetch", p] if p is not None else [])) for p in (0, 1, 2, None)}
    for p, r in runs.items():
        assert r.returncode == 0, (p, r.stderr)
    ref = runs[0]
    assert len(losses(ref)) == 6, ref.stderr
    assert "Epoch 1 [2/3] Loss:" in ref.stdout, ref.stdout
    for p in (1, 2, None):
        assert losses(runs[p]) == losses(ref), p
        assert checksum(runs[p]) == checksum(ref) and checksum(ref), p
        assert re.findall(r"test accuracy: \S+", runs[p].stdout) == \
            re.findall(r"test accuracy: \S+", ref.stdout), p
    for p, r in runs.items():
        wait = re.search(r"T2600: input: ([\d.]+) s waiting for batches in 6 steps, ([\d.]+) s "
                         r"of it in the first, ([\d.]+) ms/step after it \(--prefetch (\d)\)",
                         r.stderr)
        assert wait, r.stderr
        assert wait.group(4) == str(0 if p is None else p)  # the CPU's default: 0
        assert float(wait.group(2)) <= float(wait.group(1))


def test_losses_identical_with_accum_steps():
    # 18 samples: 5 batches per epoch, steps of 2, 2 and 1 batches
    base = ["--data", "synthetic", "--num-samples", "18", "--epochs", "2", "--accum-steps", "2"]
    a, b = train(*base, "--prefetch", "0"), train(*base, "--prefetch", "3")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert len(losses(a)) == 6, a.stderr
    assert losses(a) == losses(b)
    assert checksum(a) == checksum(b)


def test_resume_mid_epoch_with_the_loader_is_exact(tmp_path):
    base = ["--data", "synthetic", "--num-samples", "22", "--epochs", "2"]
    ref = train(*base, "--prefetch", "0", "--save", tmp_path / "ref.safetensors")
    assert ref.returncode == 0, ref.stderr
    ck, out = tmp_path / "ck.safetensors", tmp_path / "out.safetensors"
    r = train(*base, "--prefetch", "2", "--checkpoint", ck, "--steps", "4")
    assert r.returncode == 0, r.stderr
    assert losses(r) == losses(ref)[:4]
    r = train(*base, "--prefetch", "2", "--checkpoint", ck, "--save", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].endswith("(epoch 0, batch 4, step 4)"), r.stdout
    assert losses(r) == losses(ref)[4:]
    assert out.read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_corrupt_jpeg_fails_at_its_batch_as_without_the_loader(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    for c in range(2):
        os.makedirs(tmp_path / "data" / f"c{c}")
        for i in range(8):
            im = Image.new("RGB", (40, 36), (30 * i, 100 + 10 * c, 200 - 20 * i))
            im.save(tmp_path / "data" / f"c{c}" / f"{i}.jpg", "JPEG", quality=90)
    # sample 9 (c1/1.jpg) in the order without shuffling: the third batch
    (tmp_path / "data" / "c1" / "1.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    base = ["--data", f"folder:{tmp_path / 'data'}", "--no-shuffle", "--epochs", "1"]
    runs = [train(*base, "--prefetch", p) for p in ("0", "2", "8")]
    for r in runs:
        assert r.returncode == 1, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert re.fullmatch(r"cddp-train: .*c1/1\.jpg: corrupt JPEG.*", last), r.stderr
        assert [s for s, _ in losses(r)] == ["1", "2"], r.stderr
    assert len({r.stderr.strip().splitlines()[-1] for r in runs}) == 1
    assert runs[1].stdout == runs[0].stdout == runs[2].stdout


def test_sigterm_with_the_loader_saves_the_step(tmp_path, background):
    base = ["--data", "synthetic", "--num-samples", "22", "--epochs", "2"]
    ref = train(*base, "--prefetch", "0", "--save", tmp_path / "ref.safetensors")
    assert ref.returncode == 0, ref.stderr
    ck, out, log = tmp_path / "ck.safetensors", tmp_path / "out.safetensors", tmp_path / "log"
    with open(log, "w") as fh:
        p = background([binary("cddp-train")] + TINY + base +
                       ["--prefetch", "2", "--checkpoint", ck, "--fault", "slow@step=3,ms=1500"],
                       env=DEBUG, stdout=subprocess.DEVNULL, stderr=fh)
    wait_for(lambda: "T6103: fault injection: sleeping" in log.read_text(), timeout=120,
             what="step 4's sleep")
    p.signal(signal.SIGTERM)
    assert p.wait(60) == -signal.SIGTERM, log.read_text()
    assert re.search(r"WARNING T2011: Terminated: checkpoint at step 4 written", log.read_text())
    r = train(*base, "--prefetch", "2", "--checkpoint", ck, "--save", out)
    assert r.returncode == 0, r.stderr
    assert "step 4)" in r.stdout.splitlines()[0], r.stdout
    assert out.read_bytes() == (tmp_path / "ref.safetensors").read_bytes()

def test_cuda_uploads_give_the_same_losses():
    cfg = BUILD / "config.h"
    if not (cfg.exists() and "#define CDDP_HAVE_CUDA 1" in cfg.read_text()):
        pytest.skip("built without CUDA")
    if not (any(pathlib.Path("/dev").glob("nvidia[0-9]*")) and shutil.which("nvidia-smi")):
        pytest.skip("no CUDA device is visible")
    base = ["--device", "cuda", "--deterministic", "--data", "synthetic", "--num-samples", "22",
            "--epochs", "2", "--eval", "--eval-limit", "10"]
    a, a2 = train(*base, "--prefetch", "0"), train(*base, "--prefetch", "0")
    b = train(*base)  # the default on cuda: 2
    for r in (a, a2, b):
        assert r.returncode == 0, r.stderr
    if losses(a) != losses(a2):
        pytest.skip("two --prefetch 0 runs on this device already differ")
    assert losses(b) == losses(a) and len(losses(a)) == 12
    assert checksum(b) == checksum(a)
    assert "(--prefetch 2)" in re.search(r"T2600: .*", b.stderr).group(0)
