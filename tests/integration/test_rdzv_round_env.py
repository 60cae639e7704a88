"""cddprun exports CDDP_RDZV_ROUND (cddp's own, beside torchrun's variables):
the rendezvous round, which the NCCL backend names in its unique id's store
key with TORCHELASTIC_RESTART_COUNT, so a restarted group never reads the
id of the group before it (docs/distributed.md, "The NCCL backend").
"""
import os

from conftest import binary, free_port, run


def test_round_is_exported_and_grows_on_restart(tmp_path):
    w = tmp_path / "dump"
    # Attempt 0 fails (local rank 0, once local rank 1 has written its
    # environment: the agent stops the others when one fails), attempt 1
    # succeeds; each worker leaves its environment behind.
    w.write_text("#!/bin/sh\n"
                 f'd="{tmp_path}"; a=$TORCHELASTIC_RESTART_COUNT\n'
                 'env > "$d/tmp.$a.$LOCAL_RANK" && mv "$d/tmp.$a.$LOCAL_RANK" "$d/env.$a.$LOCAL_RANK"\n'
                 '[ "$a" = 1 ] && exit 0\n'
                 '[ "$LOCAL_RANK" = 1 ] && exec sleep 30\n'
                 'for i in $(seq 200); do [ -e "$d/env.0.1" ] && exit 1; sleep 0.05; done\n'
                 'exit 1\n')
    w.chmod(0o755)
    r = run([binary("cddprun"), "--nproc_per_node=2", f"--master_port={free_port()}",
             "--max_restarts=1", str(w)], timeout=60, env=dict(os.environ))
    assert r.returncode == 0, r.stderr

    def var(attempt, lr):
        for line in (tmp_path / f"env.{attempt}.{lr}").read_text().splitlines():
            k, _, v = line.partition("=")
            if k == "CDDP_RDZV_ROUND":
                return v
        return None

    first, second = var(0, 0), var(1, 0)
    assert first is not None and int(first) >= 1, first
    assert var(0, 1) == first  # every worker of a round sees the same number
    assert second is not None and int(second) > int(first), (first, second)
    assert var(1, 1) == second
