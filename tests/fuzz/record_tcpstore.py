#!/usr/bin/python3
"""Records what a real torch TCPStore client sends, as fuzz seeds.

Starts torch's own TCPStore server (is_master=True), puts a recording proxy
in front of it, and drives a client through every operation the Python API
of this torch has. Each client connection's bytes (client -> server) go to
OUT/<torch version>_<n>.bin; the server's replies to OUT/<...>_<n>.reply.

    /usr/bin/python3 tests/fuzz/record_tcpstore.py tests/fuzz/seeds/tcpstore
"""
import datetime
import os
import socket
import sys
import threading

import torch
import torch.distributed as dist

out_dir = sys.argv[1]
version = "torch" + torch.__version__.split("+")[0].replace(".", "_")


def pump(src, dst, buf, done):
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            done.set()
            return
        buf.extend(data)
        dst.sendall(data)


def record(n, c, upstream_port):
    u = socket.create_connection(("127.0.0.1", upstream_port))
    up, down = bytearray(), bytearray()
    d1, d2 = threading.Event(), threading.Event()
    threading.Thread(target=pump, args=(c, u, up, d1), daemon=True).start()
    threading.Thread(target=pump, args=(u, c, down, d2), daemon=True).start()
    d1.wait()
    d2.wait(2)
    if up:
        with open(os.path.join(out_dir, f"{version}_{n}.bin"), "wb") as fh:
            fh.write(bytes(up))
        with open(os.path.join(out_dir, f"{version}_{n}.reply"), "wb") as fh:
            fh.write(bytes(down))
        print(f"{version}_{n}: {len(up)} bytes sent, {len(down)} bytes received", flush=True)


def proxy(listener, upstream_port):
    n = 0
    while True:
        c, _ = listener.accept()
        threading.Thread(target=record, args=(n, c, upstream_port)).start()
        n += 1


# The client holds the GIL while it waits for replies: the proxy runs in a
# process of its own.
master = dist.TCPStore("127.0.0.1", 0, 2, True, datetime.timedelta(seconds=30), wait_for_workers=False)
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
pid = os.fork()
if pid == 0:
    proxy(listener, master.port)
    os._exit(0)

t = datetime.timedelta(seconds=5)
client = dist.TCPStore("127.0.0.1", listener.getsockname()[1], 2, False, t)
client.set("key0", "value0")
client.set("empty", b"")
client.set("binary", bytes(range(256)))
assert client.get("key0") == b"value0"
assert client.add("counter", 3) == 3
assert client.add("counter", -1) == 2
client.compare_set("key0", "value0", "value1")
client.compare_set("absent", "", "created")
client.compare_set("absent2", "x", "y")
client.wait(["key0", "counter"])
client.wait(["key0"], datetime.timedelta(seconds=2))
client.num_keys()
client.delete_key("key0")
client.delete_key("key0")
client.set_timeout(datetime.timedelta(seconds=3))
try:
    client.wait(["never"], datetime.timedelta(milliseconds=200))
except Exception:
    pass
master.set("never", "late")  # the timed-out wait's late STOP_WAITING
del client
import signal
import time

time.sleep(1.0)
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
