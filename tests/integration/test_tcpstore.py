"""The TCPStore-compatible server (store/tcpstore.c) as cddp-tcpstore on
loopback, with the real torch 1.13 client (Debian's python3-torch) as
its client: every operation torch 1.13's Python API has, values of 0 bytes
and of several MiB, many clients at once, init_process_group with gloo
against it; and raw sockets for what 1.13's Python API does not reach
(CHECK, WATCH_KEY, torch 2.x's numbering) and for bad input (garbage,
truncated and oversized queries, a half-open client), after which the next
client must still be answered."""
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import TORCH_PY, binary, run, wait_for

pytestmark = pytest.mark.torch


class Store:
    """cddp-tcpstore on 127.0.0.1 and a free port."""

    def __init__(self, background, *args):
        self.proc = background([binary("cddp-tcpstore"), "--host", "127.0.0.1", "--port", "0",
                                *args], env={**os.environ, "LOGLEVEL": "INFO"})
        line = self.proc.proc.stdout.readline()
        assert "listening on port" in line, line
        self.port = int(line.split()[-1])

    def log(self):
        """Stops the server (SIGTERM) and returns its log (stderr); it must
        exit 0: every handle closed, nothing leaked under ASan."""
        if self.proc.proc.poll() is None:
            self.proc.signal(signal.SIGTERM)
            self.proc.wait(timeout=20)
        err = self.proc.err or ""
        assert self.proc.proc.returncode == 0, err
        assert "Sanitizer" not in err, err
        return err

    def alive(self):
        return self.proc.proc.poll() is None


@pytest.fixture
def store(background, torch_python):
    st = Store(background)
    yield st
    st.log()


def torch_client(port, code, timeout=60, **env):
    """Runs code with `store`, a torch 1.13 TCPStore client (is_master=False)."""
    prog = textwrap.dedent("""\
        import datetime, sys
        import torch.distributed as dist
        store = dist.TCPStore("127.0.0.1", %d, 1, False, datetime.timedelta(seconds=20))
        """ % port) + textwrap.dedent(code)
    r = run([TORCH_PY, "-c", prog], timeout=timeout, env={**os.environ, **env})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# ---- raw wire helpers (docs/tcpstore.md) ----

def s(b):
    if isinstance(b, str):
        b = b.encode()
    return struct.pack("<Q", len(b)) + b


def q(t, *parts):
    return bytes([t]) + b"".join(parts)


def keys(*ks):
    return struct.pack("<Q", len(ks)) + b"".join(s(k) for k in ks)


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def recv_bytes(sock):
    (n,) = struct.unpack("<Q", recv_exact(sock, 8))
    return recv_exact(sock, n)


def recv_i64(sock):
    return struct.unpack("<q", recv_exact(sock, 8))[0]


def connect(port):
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def closed_by_server(sock, timeout=10):
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


# ---- torch 1.13's client ----

def test_every_operation_of_torch_113(store):
    out = torch_client(store.port, """
        import datetime
        store.set("a", "hello")
        assert store.get("a") == b"hello"
        store.set("a", b"")                       # 0 bytes
        assert store.get("a") == b""
        big = bytes(range(256)) * (6 << 12)       # 6 MiB
        store.set("big", big)
        assert store.get("big") == big
        assert store.add("n", 5) == 5
        assert store.add("n", -7) == -2
        assert store.add("n", 0) == -2
        assert store.get("n") == b"-2"
        assert store.add("huge", 2**62) == 2**62  # TCPStore's int64, not 2^53
        # compare_set: match, mismatch, missing with empty and non-empty expected
        assert store.compare_set("a", "", "x") == b"x"
        assert store.compare_set("a", "y", "z") == b"x"
        assert store.compare_set("missing", "", "new") == b"new"
        assert store.compare_set("missing2", "exp", "new") == b"exp"
        store.wait(["a", "n"])
        store.wait(["a"], datetime.timedelta(seconds=1))
        t0 = datetime.datetime.now()
        try:
            store.wait(["never"], datetime.timedelta(milliseconds=300))
            raise SystemExit("wait did not time out")
        except RuntimeError as e:
            assert "timeout" in str(e).lower(), e
        assert (datetime.datetime.now() - t0).total_seconds() < 5
        # init/ (the client's own join key), a, big, n, huge, missing
        assert store.num_keys() == 6, store.num_keys()
        assert store.delete_key("big") is True
        assert store.delete_key("big") is False
        assert store.num_keys() == 5
        store.set_timeout(datetime.timedelta(milliseconds=300))
        try:
            store.get("absent")
            raise SystemExit("get of an absent key did not time out")
        except RuntimeError:
            pass
        print("ok")
        """)
    assert out.strip().endswith("ok")
    assert store.alive()


def test_wait_is_woken_by_another_client(store):
    waiter = subprocess.Popen([TORCH_PY, "-c", textwrap.dedent("""\
        import datetime, torch.distributed as dist
        s = dist.TCPStore("127.0.0.1", %d, 1, False, datetime.timedelta(seconds=30))
        s.wait(["k1", "k2"])
        print(s.get("k2").decode())
        """ % store.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The waiter is connected and waiting once it has added its init/ key.
        torch_client(store.port, """
            import time
            for _ in range(300):
                if store.add("init/", 0) >= 2:
                    break
                time.sleep(0.05)
            store.set("k1", "1")
            time.sleep(0.2)
            store.set("k2", "second")
            """)
        out, err = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
    assert waiter.returncode == 0, err
    assert out.strip() == "second"


def test_many_clients_at_once(store):
    """8 processes with 25 connections each, all open at the same time."""
    code = textwrap.dedent("""\
        import datetime, torch.distributed as dist
        t = datetime.timedelta(seconds=60)
        stores = [dist.TCPStore("127.0.0.1", %d, None, False, t) for _ in range(25)]
        for i, st in enumerate(stores):
            st.add("count", 1)
            st.set("proc%%s_%%d" %% (__import__("os").getpid(), i), b"v" * i)
        stores[0].add("done", 1)
        stores[0].wait(["go"])
        assert int(stores[-1].get("count")) == 200
        """ % store.port)
    procs = [subprocess.Popen([TORCH_PY, "-c", code], stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    try:
        torch_client(store.port, """
            import time
            deadline = time.time() + 100
            while store.add("done", 0) < 8 and time.time() < deadline:
                time.sleep(0.05)
            assert store.add("done", 0) == 8
            assert store.add("count", 0) == 200
            store.set("go", "1")
            """, timeout=120)
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            p.kill()


@pytest.mark.parametrize("method", ["env", "tcp"])
def test_init_process_group_gloo(store, method):
    """Two ranks, TORCHELASTIC_USE_AGENT_STORE=True as torchrun 2.x sets it:
    every rank is a client of our store; gloo's bootstrap runs through it."""
    code = textwrap.dedent("""\
        import datetime, os, sys
        import torch, torch.distributed as dist
        rank = int(sys.argv[1])
        if sys.argv[2] == "env":
            dist.init_process_group("gloo", rank=rank, world_size=2,
                                    timeout=datetime.timedelta(seconds=60))
        else:
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["MASTER_PORT"],
                                    rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
        t = torch.tensor([float(rank + 1)] * 4)
        dist.all_reduce(t)
        assert t.tolist() == [3.0] * 4, t
        dist.barrier()
        dist.destroy_process_group()
        print("rank", rank, "ok")
        """)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
           "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([TORCH_PY, "-c", code, str(r), method], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            assert f"rank {r} ok" in out
    finally:
        for p in procs:
            p.kill()
    # The keys went where torch's env:// puts them with an agent store.
    keys_seen = torch_client(store.port, "print(store.num_keys())")
    assert int(keys_seen.split()[-1]) >= 3


def test_torchrun_c10d_rendezvous_on_our_store(store, tmp_path):
    """torchrun 1.13's c10d rendezvous backend (compare_set loops, waits)
    with our store as its store (is_host=false), then gloo in the workers."""
    import pathlib
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""\
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(2) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        assert t.tolist() == [3.0, 3.0], t
        # One write(2): both workers share torchrun's stdout, and print()
        # may write a line in pieces that the other worker's land between.
        os.write(1, f"rank {dist.get_rank()} ok\\n".encode())
        """))
    torchrun = pathlib.Path(__file__).resolve().parent.parent / "compat" / "torchrun_py311.py"
    r = run([TORCH_PY, torchrun, "--nnodes=1", "--nproc_per_node=2", "--rdzv_backend=c10d",
             f"--rdzv_endpoint=127.0.0.1:{store.port}", "--rdzv_id=job7",
             "--rdzv_conf", "is_host=false", "--max_restarts=0", script], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0 ok" in r.stdout and "rank 1 ok" in r.stdout
    # The rendezvous state torchrun kept in our store.
    out = torch_client(store.port, 'print(len(store.get("torch.rendezvous.job7")))')
    assert int(out.split()[-1]) > 0


# ---- what torch 1.13's Python API does not reach ----

def test_check_and_watch_key_v1(store):
    """CHECK (type 4) and WATCH_KEY (type 7) of torch 1.13's numbering; the
    watch gets torch 1.13's events: created, updated, deleted."""
    c = connect(store.port)
    w = connect(store.port)
    c.sendall(q(4, keys("/x")))
    assert recv_exact(c, 1) == b"\x01"  # NOT_READY
    w.sendall(q(7, s("/x")))
    assert recv_exact(w, 1) == b"\x03"  # KEY_CALLBACK_REGISTERED
    torch_client(store.port, 'store.set("x", "one"); store.set("x", "two"); store.delete_key("x")')
    events = []
    for _ in range(3):
        kind = recv_exact(w, 1)[0]
        events.append((kind, recv_bytes(w), recv_bytes(w), recv_bytes(w)))
    assert events == [(1, b"/x", b"", b"one"), (0, b"/x", b"one", b"two"),
                      (2, b"/x", b"two", b"")]
    c.sendall(q(0, s("/x"), s("v")) + q(4, keys("/x")))
    assert recv_exact(c, 1) == b"\x00"  # READY
    c.close()
    w.close()


def test_torch2_numbering_raw(store):
    """A torch 2.x session as its client sends it (TCPStore.cpp, 2.x):
    VALIDATE, PING, then the 2.x numbering including its additions."""
    c = connect(store.port)
    c.sendall(q(0, struct.pack("<I", 0x3C85F7CE)) + q(13, struct.pack("<I", 4242)))
    assert struct.unpack("<I", recv_exact(c, 4))[0] == 4242
    c.sendall(q(1, s("/k"), s("v")) + q(3, s("/k")))               # SET, GET
    assert recv_bytes(c) == b"v"
    c.sendall(q(4, s("/n"), struct.pack("<q", 7)))                  # ADD
    assert recv_i64(c) == 7
    c.sendall(q(9, s("/k"), s("w")) + q(3, s("/k")))                # APPEND
    assert recv_bytes(c) == b"vw"
    c.sendall(q(11, struct.pack("<q", 2), s("/m1"), s("1"), s("/m2"), s("")))  # MULTI_SET
    c.sendall(q(10, keys("/m1", "/m2", "/nope")))                   # MULTI_GET
    assert [recv_bytes(c) for _ in range(3)] == [b"1", b"", b""]
    c.sendall(q(7))                                                 # GETNUMKEYS
    assert recv_i64(c) == 4
    c.sendall(q(5, keys("/k", "/nope")))                            # CHECK
    assert recv_exact(c, 1) == b"\x01"
    c.sendall(q(6, keys("/later")) + q(12))                         # WAIT, CANCEL_WAIT
    assert recv_exact(c, 1) == b"\x01"                              # WAIT_CANCELED
    c.sendall(q(14, s("/q"), s("item1")) + q(14, s("/q"), s("item2")) + q(16, s("/q")))
    assert recv_i64(c) == 2                                         # QUEUE_LEN
    c.sendall(q(15, s("/q")))                                       # QUEUE_POP
    assert recv_i64(c) == 2 and recv_bytes(c) == b"item1"
    c.sendall(q(17))                                                # LIST
    n = recv_i64(c)
    assert sorted(recv_bytes(c) for _ in range(n)) == [b"/k", b"/m1", b"/m2", b"/n"]
    c.sendall(q(8, s("/k")))                                        # DELETE_KEY
    assert recv_i64(c) == 1
    # A wait that another connection's set completes.
    other = connect(store.port)
    other.sendall(q(0, struct.pack("<I", 0x3C85F7CE)))
    c.sendall(q(6, keys("/w1", "/w2")))
    other.sendall(q(1, s("/w1"), s("a")) + q(1, s("/w2"), s("b")))
    assert recv_exact(c, 1) == b"\x00"                              # STOP_WAITING
    # A blocking queue pop: wait on the queue's name, then pop.
    c.sendall(q(6, keys("/q2")))
    other.sendall(q(14, s("/q2"), s("x")))
    assert recv_exact(c, 1) == b"\x00"
    c.sendall(q(15, s("/q2")))
    assert recv_i64(c) == 1 and recv_bytes(c) == b"x"
    c.sendall(q(15, s("/q2")))
    assert recv_i64(c) == 0                                         # empty: no value follows
    c.sendall(q(13, struct.pack("<I", 1)))
    assert struct.unpack("<I", recv_exact(c, 4))[0] == 1
    c.close()
    other.close()


# ---- bad input: the connection goes, the store stays ----

def test_bad_input_closes_only_that_connection(background, torch_python):
    st = Store(background, "--max-value", "1024")
    torch_client(st.port, 'store.set("kept", "yes")')
    half_open = connect(st.port)
    half_open.sendall(q(0, s("/partial"))[:12])                 # a query begun, never finished
    idle = connect(st.port)                                     # connected, says nothing
    cases = {
        "garbage": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "unknown type": bytes([13]) + b"\x00" * 8,             # PING is not in 1.13's numbering
        "oversized key": q(2, struct.pack("<Q", 1 << 40)),
        "oversized value": q(0, s("/k"), struct.pack("<Q", 4096)),
        "bad magic": q(0, struct.pack("<I", 0x3C85F7CE)) + q(0, struct.pack("<I", 1)),
        "NUL in key": q(2, s(b"a\0b")),
    }
    for name, data in cases.items():
        c = connect(st.port)
        c.sendall(data)
        assert closed_by_server(c), name
        c.close()
    truncated = connect(st.port)
    truncated.sendall(q(3, s("/n"))[:5])
    truncated.close()                                           # gone mid-query
    # A torch client whose value is past the limit: it fails, the store does not.
    r = run([TORCH_PY, "-c", textwrap.dedent("""\
        import datetime, torch.distributed as dist
        s = dist.TCPStore("127.0.0.1", %d, None, False, datetime.timedelta(seconds=5))
        s.set("toobig", b"x" * 2048)
        s.get("toobig")
        """ % st.port)], timeout=60)
    assert r.returncode != 0
    # The next client is answered, the old key is there.
    out = torch_client(st.port, 'print(store.get("kept").decode())')
    assert out.strip() == "yes"
    assert st.alive()
    half_open.close()
    idle.close()
    log = st.log()
    refused = [l for l in log.splitlines() if "S0703" in l]
    assert len(refused) >= len(cases) + 1, log
    assert any("unknown query type 13" in l for l in refused), log
    assert any("past the limits" in l for l in refused), log
    assert any("wrong magic" in l for l in refused), log


def test_client_that_does_not_read(background, torch_python):
    st = Store(background, "--max-write-queue", str(1 << 20))
    c = connect(st.port)
    value = b"x" * (512 << 10)
    c.sendall(q(0, s("/big"), s(value)))
    c.settimeout(30)
    try:
        for _ in range(200):   # 100 MiB of replies asked for, none read
            c.sendall(q(2, s("/big")))
    except (ConnectionResetError, BrokenPipeError, socket.timeout):
        pass
    out = torch_client(st.port, 'print(len(store.get("big")))')
    assert out.strip() == str(len(value))
    c.close()
    log = st.log()
    assert "S0705" in log and "does not read its replies" in log, log


def test_full_store(background, torch_python):
    st = Store(background, "--max-store-bytes", str(1 << 20))
    torch_client(st.port, 'store.set("small", "kept")')
    r = run([TORCH_PY, "-c", textwrap.dedent("""\
        import datetime, torch.distributed as dist
        s = dist.TCPStore("127.0.0.1", %d, None, False, datetime.timedelta(seconds=5))
        for i in range(100):
            s.set("v%%d" %% i, b"x" * 100000)
            s.num_keys()
        """ % st.port)], timeout=60)
    assert r.returncode != 0
    out = torch_client(st.port, 'print(store.get("small").decode(), store.num_keys() < 20)')
    assert out.split() == ["kept", "True"]
    log = st.log()
    assert "S0706" in log and "SET refused by the store" in log, log


def test_bytes_held_for_all_clients(background, torch_python):
    """Unfinished queries count against one limit for all clients together."""
    st = Store(background, "--max-held", str(1 << 20))
    first, second = connect(st.port), connect(st.port)
    part = q(0, s("/a"), struct.pack("<Q", 700 << 10)) + b"x" * (600 << 10)
    first.sendall(part)
    time.sleep(0.3)
    second.sendall(part)
    assert closed_by_server(second)
    out = torch_client(st.port, 'store.set("k", "v"); print(store.get("k").decode())')
    assert out.strip() == "v"
    first.sendall(b"x" * (100 << 10))                 # completes: the bytes are released
    torch_client(st.port, 'assert store.get("a") == b"x" * (700 << 10)')
    first.close()
    log = st.log()
    assert "holds" in log and "its limit" in log, log


def test_many_idle_connections(store):
    """10,000 connections that say nothing do not stop the store."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 10100:
        pytest.skip(f"RLIMIT_NOFILE is {hard}; 10,000 connections need more")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    conns = [connect(store.port) for _ in range(10000)]
    out = torch_client(store.port, 'store.set("a", "b"); print(store.get("a").decode())')
    assert out.strip() == "b"
    for c in conns:
        c.close()
    assert store.alive()
