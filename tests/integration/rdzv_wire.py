"""A small, independent Python implementation of the cddp wire protocol
(docs/protocol.md) for the process tests: frames of a 4-byte big-endian
length and one JSON object. It lets tests speak to cddp-rdzv directly,
including speaking wrongly on purpose."""
import base64
import json
import socket
import struct
import time

VERSION = 1


def frame(obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(data)) + data


class Peer:
    """One connection. recv() returns decoded messages; None on EOF."""

    def __init__(self, host, port, timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.next_id = 1

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, type_, **fields):
        msg = {"v": VERSION, "type": type_}
        msg.update(fields)
        self.sock.sendall(frame(msg))

    def send_raw(self, data):
        self.sock.sendall(data)

    def recv(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    payload = self.buf[4:4 + n]
                    self.buf = self.buf[4 + n:]
                    return json.loads(payload)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no message within {timeout}s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buf += chunk

    def expect(self, type_, timeout=10.0, skip=("joined",)):
        """The next message of type_, skipping the kinds in skip."""
        while True:
            m = self.recv(timeout)
            if m is None:
                raise AssertionError(f"connection closed while waiting for '{type_}'")
            if m["type"] == type_:
                return m
            if m["type"] not in skip:
                raise AssertionError(f"expected '{type_}', got {m}")

    def closed_by_peer(self, timeout=5.0):
        """True once the server has closed this connection (EOF or reset)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                m = self.recv(max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                return False
            if m is None:
                return True
        return False

    # conveniences
    def hello(self, run_id="", token=None):
        f = {"run_id": run_id, "client": "pytest"}
        if token is not None:
            f["token"] = token
        self.send("hello", **f)
        return self.recv()

    def join(self, node_id, min_nodes, max_nodes, nproc=1, conf=None, master_port=0, **extra):
        self.send("join", node_id=node_id, nproc=nproc, min_nodes=min_nodes,
                  max_nodes=max_nodes, master_port=master_port, conf=conf or {}, **extra)

    def request(self, type_, **fields):
        rid = self.next_id
        self.next_id += 1
        self.send(type_, id=rid, **fields)
        return rid

    def result(self, rid, timeout=10.0):
        while True:
            m = self.recv(timeout)
            if m is None:
                raise AssertionError("connection closed while waiting for a result")
            if m["type"] == "result" and m["id"] == rid:
                return m

    def set(self, key, value):
        return self.result(self.request("set", key=key, value=b64(value)))

    def get(self, key, timeout_ms=None):
        f = {"key": key}
        if timeout_ms is not None:
            f["timeout_ms"] = timeout_ms
        return self.result(self.request("get", **f))


def b64(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


def unb64(s):
    return base64.b64decode(s)
