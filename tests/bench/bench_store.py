#!/usr/bin/env python3
"""TCPStore servers side by side (docs/benchmarks.md, docs/tcpstore.md):
cddp's (store/tcpstore.c, as `cddp-tcpstore`) against torch 1.13's own
(`torch.distributed.TCPStore(is_master=True)` in Debian's python3).

    ninja -C build && /usr/bin/python3 tests/bench/bench_store.py [--seconds 2]

Latency and throughput: tests/bench/store_load.c (torch's wire protocol,
1.13 numbering, through store/tcpstore_wire.c) with 1, 64 and 1,024
clients, each one query in flight on a key of its own: set (SET, then a
CHECK: SET has no reply), get, add, wait (on a present key). The servers
alternate row by row. Barrier: N simulated ranks, one connection each, do
torch's store barrier (ADD, the last one SETs, every one WAITs); a fresh
server for each.
"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TORCH_SERVER = r"""
import datetime, resource, signal
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=600),
                  wait_for_workers=False)
print("listening on port", s.port, flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
"""


class Server:
    def __init__(self, kind, build):
        self.kind = kind
        if kind == "cddp":
            cmd = [f"{build}/tests/helpers/cddp-tcpstore", "--port", "0"]
        else:
            cmd = ["/usr/bin/python3", "-c", TORCH_SERVER]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        line = self.p.stdout.readline()
        if "port" not in line:
            sys.exit(f"{kind} server did not start: {line!r}")
        self.port = int(line.split()[-1])

    def close(self):
        self.p.terminate()
        self.p.wait(timeout=30)


def load(build, port, *args, timeout=300):
    r = subprocess.run([f"{build}/tests/bench/store-load", "--port", str(port), *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        return {"error": r.stderr.strip()}
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--clients", default="1,64,1024")
    ap.add_argument("--barrier", default="1000,10000")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, Linux {platform.release()}, load average "
          f"{os.getloadavg()[0]:.2f} at the start, RLIMIT_NOFILE {hard}")
    servers = {k: Server(k, a.build) for k in ("cddp", "torch")}
    print("| clients | op | cddp ops/s | torch 1.13 ops/s | ratio | cddp p50 / p99 us "
          "| torch p50 / p99 us |")
    print("|---|---|---|---|---|---|---|")
    try:
        for n in map(int, a.clients.split(",")):
            for op in ("set", "get", "add", "wait"):
                res = {k: load(a.build, s.port, "--clients", n, "--op", op,
                               "--seconds", a.seconds) for k, s in servers.items()}
                c, t = res["cddp"], res["torch"]
                if "error" in c or "error" in t:
                    print(f"| {n} | {op} | {c.get('ops_per_s', c.get('error'))} "
                          f"| {t.get('ops_per_s', t.get('error'))} | | | |")
                    continue
                print(f"| {n} | {op} | {c['ops_per_s']:.0f} | {t['ops_per_s']:.0f} "
                      f"| {c['ops_per_s'] / t['ops_per_s']:.2f} | {c['p50_us']} / {c['p99_us']} "
                      f"| {t['p50_us']} / {t['p99_us']} |")
    finally:
        for s in servers.values():
            s.close()
    print()
    print("| ranks | cddp: connect s | cddp: barrier s | torch 1.13: connect s "
          "| torch 1.13: barrier s |")
    print("|---|---|---|---|---|")
    for n in map(int, a.barrier.split(",")):
        row = []
        for kind in ("cddp", "torch"):
            s = Server(kind, a.build)
            try:
                r = load(a.build, s.port, "--barrier", n, "--seconds", 120, timeout=300)
            finally:
                s.close()
            row += (["failed: " + r["error"][-80:], ""] if "error" in r
                    else [f"{r['connect_s']:.3f}", f"{r['barrier_s']:.3f}"])
        print(f"| {n} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
