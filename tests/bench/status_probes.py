#!/usr/bin/python3
"""Probe latency of the status port under hostile clients (issue 28, item 4).

Kubernetes restarts a pod after failureThreshold probes in a row that got no
answer within timeoutSeconds (our example: 1 s and 3). This measures how
long GET /livez and GET /readyz take on cddprun's status port while other
clients try to pin it:

  quiet    nothing else;
  slow     N clients (default 100) that each send one byte of a request
           every 0.5 s and never finish it, reconnecting at once when cut
           (slowloris);
  idle     M connections (default 3000) that send nothing, opened at once
           and held; each one cut is opened again.

A probe is one new connection, one request, the whole answer, with a 1 s
timeout (kubelet's). Per scenario it prints the probes made, how many failed
(no answer within 1 s), and the latency's median, 99th percentile and
maximum. It prints figures; it never passes or fails on them.

    /usr/bin/python3 tests/bench/status_probes.py [--build build]
        [--seconds 10] [--slow 100] [--idle 3000]

The load runs in this process (one thread, non-blocking sockets), so it
raises its own open-file limit to the hard limit first, as cddprun does.
"""
import argparse
import os
import pathlib
import platform
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Load:
    """slow or idle clients on one selector thread; each cut one is replaced."""

    def __init__(self, port, kind, count, interval=0.5):
        self.port = port
        self.kind = kind
        self.count = count
        self.interval = interval
        self.sel = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.cuts = 0
        self.connects = 0
        self.errors = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        except OSError:
            self.errors += 1
            s.close()
            return False
        self.connects += 1
        self.sel.register(s, selectors.EVENT_READ, {"sent": 0})
        return True

    def run(self):
        for _ in range(self.count):
            if not self.open_one():
                time.sleep(0.01)
        nxt = time.monotonic() + self.interval
        while not self.stop.is_set():
            timeout = max(0.0, nxt - time.monotonic())
            for key, _ in self.sel.select(timeout):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.cuts += 1
                    self.sel.unregister(s)
                    s.close()
                    self.open_one()
            if time.monotonic() >= nxt:
                nxt += self.interval
                if self.kind == "slow":
                    for key in list(self.sel.get_map().values()):
                        s = key.fileobj
                        text = b"GET /status HTTP/1.1\r\nX-a: "
                        i = key.data["sent"]
                        try:
                            s.send(text[i:i + 1] if i < len(text) else b"a")
                            key.data["sent"] = i + 1
                        except OSError:
                            pass
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        self.sel.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def probe(port, path, timeout=1.0):
    """Seconds to the whole answer of GET path on a new connection; None
    when there was none within timeout."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(max(0.001, timeout - (time.monotonic() - t0)))
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            buf = b""
            while True:
                left = timeout - (time.monotonic() - t0)
                if left <= 0:
                    return None
                s.settimeout(left)
                d = s.recv(65536)
                if not d:
                    break
                buf += d
        if not buf.startswith(b"HTTP/1.1 200"):
            return None
        return time.monotonic() - t0
    except OSError:
        return None


def probe_for(port, seconds, every=0.2, timeout=1.0):
    """Alternates /livez and /readyz for seconds; returns (latencies, failures)."""
    lat, failed = [], 0
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t = probe(port, "/livez" if i % 2 == 0 else "/readyz", timeout)
        i += 1
        if t is None:
            failed += 1
        else:
            lat.append(t)
        time.sleep(every)
    return lat, failed


def start_agent(build, port):
    p = subprocess.Popen([str(build / "launcher" / "cddprun"), f"--status_port={port}",
                          "sleep", "3600"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 20
    while probe(port, "/readyz", 1.0) is None:
        if time.monotonic() > deadline or p.poll() is not None:
            raise SystemExit("cddprun's status port did not become ready")
        time.sleep(0.05)
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report(name, lat, failed, load=None):
    n = len(lat) + failed
    ms = sorted(x * 1000 for x in lat)
    if ms:
        p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
        figs = f"median {statistics.median(ms):7.2f} ms  p99 {p99:7.2f} ms  max {ms[-1]:7.2f} ms"
    else:
        figs = "no answers"
    extra = ""
    if load:
        extra = f"  (load: {load.connects} connects, {load.cuts} cut, {load.errors} errors)"
    print(f"{name:24s} probes {n:4d}  failed {failed:4d}  {figs}{extra}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--slow", type=int, default=100)
    ap.add_argument("--idle", type=int, default=3000)
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    lim = raise_nofile()
    if lim < args.idle + 64:
        raise SystemExit(f"the open-file hard limit ({lim}) is below --idle {args.idle}")
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {platform.machine()}, "
          f"{os.cpu_count()} CPUs; {args.seconds:g} s per scenario, probe every 0.2 s, "
          f"timeout 1 s", flush=True)
    port = free_port()
    agent = start_agent(build, port)
    try:
        lat, failed = probe_for(port, args.seconds)
        report("quiet", lat, failed)
        with Load(port, "slow", args.slow) as load:
            time.sleep(1.0)
            lat, failed = probe_for(port, args.seconds)
        report(f"slow x{args.slow}", lat, failed, load)
        with Load(port, "idle", args.idle) as load:
            time.sleep(1.0)
            lat, failed = probe_for(port, args.seconds)
        report(f"idle x{args.idle}", lat, failed, load)
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
