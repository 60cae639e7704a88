"""A torch.distributed worker that joins a gloo group through a tcp:// init
method, all-reduces once, prints one line and ends without
destroy_process_group: the script of issue 17's --run_path aborts
("terminate called without an active exception" at exit). Run by
tests/integration/test_cli_compat.py (once, asserted) and
tests/bench/bench_run_path_soak.py (over and over, counted).
"""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="tcp://%s:%s" % (
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
    rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
world = dist.get_world_size()
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t.tolist() == [world * (world + 1) / 2] * 4, t
# One write(2): the workers share the launcher's stdout.
os.write(1, b"rank %d done\n" % dist.get_rank())
