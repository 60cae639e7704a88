"""Debian 12's torchrun (torch 1.13.1) on Python 3.11, for side-by-side tests.

On 3.11, iterating an IntFlag skips the zero and multi-bit members, so 1.13's
Std.from_str("0") returns None and torchrun crashes before starting workers.
This wrapper replaces that one function (by value lookup, which is what it
meant) and runs torch.distributed.run unchanged. Usage is torchrun's:
    /usr/bin/python3 tests/compat/torchrun_py311.py --nproc_per_node=2 script.py
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return api.Std(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main

    sys.exit(main())
