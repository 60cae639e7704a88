"""trainer/data/sampler.c against torch.utils.data.DistributedSampler (Debian torch 1.13).

cddp-sampler-dump prints our indices for a batch of cases; a torch script
prints DistributedSampler's for the same cases; they must be identical, for
every rank of world sizes 1-5, shuffle off and on, drop_last off and on,
several epochs and seeds. Independently of torch, the shuffled shards of one
epoch must be disjoint and cover the padded dataset, and the order must
change from epoch to epoch.
"""
import collections
import subprocess

import pytest

from conftest import binary, run

LENS = list(range(1, 24)) + [100, 1001]
SEEDS = [0, 1234]
EPOCHS = [0, 1, 2]

TORCH_SCRIPT = r"""
import sys
from torch.utils.data import DistributedSampler
for line in sys.stdin:
    n, world, rank, shuffle, drop_last, seed, epoch = map(int, line.split())
    try:
        s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=bool(shuffle),
                               seed=seed, drop_last=bool(drop_last))
    except ValueError as e:
        print("error"); continue
    s.set_epoch(epoch)
    print(" ".join(map(str, s)))
"""


def cases():
    for n in LENS:
        for world in range(1, 6):
            for rank in range(world):
                for shuffle in (0, 1):
                    for drop_last in (0, 1):
                        if drop_last and n < world:
                            continue  # no samples for anyone: both refuse (checked below)
                        for seed in SEEDS if shuffle else [0]:
                            for epoch in EPOCHS if shuffle else [0]:
                                yield (n, world, rank, shuffle, drop_last, seed, epoch)


def ours(lines):
    r = run([binary("cddp-sampler-dump")], input="".join(lines), timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def theirs(py, lines):
    r = run([py, "-c", TORCH_SCRIPT], input="".join(lines), timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


@pytest.mark.torch
def test_indices_equal_torch_every_rank_world_1_to_5(torch_python):
    all_cases = list(cases())
    lines = [" ".join(map(str, c)) + "\n" for c in all_cases]
    got, want = ours(lines), theirs(torch_python, lines)
    assert len(got) == len(want) == len(all_cases)
    bad = [(c, g, w) for c, g, w in zip(all_cases, got, want) if g != w]
    assert not bad, f"{len(bad)} of {len(all_cases)} cases differ; first: {bad[0]}"
    # shuffle off and on were both covered, for every world size
    kinds = {(c[1], c[3]) for c in all_cases}
    assert kinds == {(w, s) for w in range(1, 6) for s in (0, 1)}


def test_shuffled_shards_disjoint_covering_and_reordered():
    # 1001 samples over 4 ranks: total 1004, so 3 indices are padding from the head.
    n, world, seed = 1001, 4, 17
    lines = [f"{n} {world} {r} 1 0 {seed} {e}\n" for e in (0, 1) for r in range(world)]
    out = [list(map(int, l.split())) for l in ours(lines)]
    for e in (0, 1):
        shards = out[e * world:(e + 1) * world]
        assert all(len(s) == 251 for s in shards)
        flat = [i for s in shards for i in s]
        counts = collections.Counter(flat)
        assert set(counts) == set(range(n)), "the padded shards do not cover the dataset"
        assert sum(c - 1 for c in counts.values()) == 3, "only the padding may repeat"
        # disjoint: within the unpadded part no index is on two ranks
        owner = {}
        for r, s in enumerate(shards):
            for pos, i in enumerate(s):
                if r + pos * world < n:
                    assert owner.setdefault(i, r) == r, f"index {i} on ranks {owner[i]} and {r}"
    assert out[0] != out[world], "epoch 1 has the same order as epoch 0"
    assert sorted(out[0]) != out[0], "not shuffled"


def test_drop_last_with_fewer_samples_than_ranks_is_refused():
    assert ours(["3 4 0 0 1 0 0\n"])[0].startswith("error")
