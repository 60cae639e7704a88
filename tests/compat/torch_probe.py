"""What the oracle's torch is and does, as one JSON object on stdout.

    $CDDP_TORCH_PYTHON tests/compat/torch_probe.py

Run it with the Python whose torch the comparisons use (tests/conftest.py's
torch_info() and tools/torch-check do). Each field is read from the torch
itself, so a version branch in the tests rests on what that torch does,
and its reason names the version where the behaviour changed:

  torch, version        torch.__version__ and (major, minor)
  python                the interpreter's version
  torchrun_needs_std_patch
                        Std.from_str("0") returns None: torch 1.13 on
                        Python >= 3.11 (iterating an IntFlag skips its zero
                        member there), where torchrun crashes before it
                        starts a worker; tests/compat/torchrun_py311.py
                        patches that one function
  local_ranks_filter    torchrun has --local-ranks-filter (torch 2.3; not 1.13)
  exports_signals_to_handle
                        LaunchConfig has signals_to_handle: the launcher
                        exports TORCHELASTIC_SIGNALS_TO_HANDLE into its own
                        environment, which the workers inherit (added after
                        pytorch#154849; not in 1.13)
  nccl_async_env        the name the agent gives NCCL's async error handling
                        variable: NCCL_ASYNC_ERROR_HANDLING up to torch 2.1,
                        TORCH_NCCL_ASYNC_ERROR_HANDLING from 2.2
  lists_stopped_peers   the agent polls the workers again after stopping
                        them for a failure, so the failure table also lists
                        the peers it stopped (exitcode -15); torch 1.13
                        lists only the workers that had failed
  c10d_agent_store      the c10d rendezvous handler has use_agent_store:
                        torchrun's c10d backend hands the workers its own
                        TCPStore (TORCHELASTIC_USE_AGENT_STORE=True, torch
                        >= 2.4, pytorch#128096); without it (1.13) only the
                        static backend does
  tcpstore_use_libuv    TCPStore takes use_libuv (torch 2.x; its libuv
                        server is the default since 2.4)
  tcpstore_queues       TCPStore has queue_push/queue_pop/queue_len
  torchvision, pillow, numpy
                        their versions, or null
  cuda, cuda_devices, nccl
                        torch.cuda.is_available(), the device count and
                        NCCL's version (null without CUDA)
  fqdn, fqdn_resolves   socket.getfqdn() and whether it resolves: torch 2.x's
                        c10d rendezvous gives the workers MASTER_ADDR =
                        the FQDN unless --local_addr is set
  probe_errors          the probes that raised (a module moved in some
                        version), each keeping a default by version
  error                 set (and little else) when torch does not import
"""
import dataclasses
import json
import platform
import re
import socket
import sys


def version_of(module):
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: the report says null
        return None


def main():
    info = {"python": platform.python_version(), "executable": sys.executable}
    try:
        import torch
        import torch.distributed  # noqa: F401
    except Exception as e:
        info["error"] = f"import torch failed: {type(e).__name__}: {e}"
        print(json.dumps(info))
        return 0
    info["torch"] = torch.__version__
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    info["version"] = list(version)
    # A probe that raises (a module moved in some version) records its
    # error and leaves its default: the report shows it, the run goes on.
    info["probe_errors"] = []

    def probe(name, default, fn):
        try:
            info[name] = fn()
        except Exception as e:
            info[name] = default
            info["probe_errors"].append(f"{name}: {type(e).__name__}: {e}")

    def std_broken():
        from torch.distributed.elastic.multiprocessing.api import Std
        try:
            return Std.from_str("0") is None
        except Exception:
            return True

    def has_filter():
        from torch.distributed.run import get_args_parser
        options = {o for act in get_args_parser()._actions for o in act.option_strings}
        return "--local-ranks-filter" in options or "--local_ranks_filter" in options

    def launch_fields():
        from torch.distributed.launcher.api import LaunchConfig
        return "signals_to_handle" in {f.name for f in dataclasses.fields(LaunchConfig)}

    def repolls():
        from torch.distributed.elastic.multiprocessing.api import SubprocessContext
        return hasattr(SubprocessContext, "_capture_process_failures")

    def c10d_shares():
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler)
        return hasattr(DynamicRendezvousHandler, "use_agent_store")

    def tcpstore():
        from torch.distributed import TCPStore
        return TCPStore

    probe("torchrun_needs_std_patch", version < (2, 0), std_broken)
    probe("local_ranks_filter", version >= (2, 3), has_filter)
    probe("exports_signals_to_handle", False, launch_fields)
    info["nccl_async_env"] = ("TORCH_NCCL_ASYNC_ERROR_HANDLING" if version >= (2, 2)
                              else "NCCL_ASYNC_ERROR_HANDLING")
    probe("lists_stopped_peers", False, repolls)
    probe("c10d_agent_store", version >= (2, 4), c10d_shares)
    probe("tcpstore_use_libuv", False, lambda: "use_libuv" in (tcpstore().__init__.__doc__ or ""))
    probe("tcpstore_queues", False, lambda: hasattr(tcpstore(), "queue_push"))

    info["torchvision"] = version_of("torchvision")
    info["pillow"] = version_of("PIL")
    info["numpy"] = version_of("numpy")

    probe("cuda", False, lambda: bool(torch.cuda.is_available()))
    info["cuda_devices"] = 0
    info["nccl"] = None
    if info["cuda"]:
        probe("cuda_devices", 0, torch.cuda.device_count)
        probe("nccl", "unknown", lambda: ".".join(map(str, torch.cuda.nccl.version())))

    info["fqdn"] = socket.getfqdn()
    try:
        socket.getaddrinfo(info["fqdn"], None)
        info["fqdn_resolves"] = True
    except OSError:
        info["fqdn_resolves"] = False
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
