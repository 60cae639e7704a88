"""Drives tests/helpers/status_testserver (the status port embedded in a small
libuv program) for the status port and cddpctl tests, and fetches from it with
curl, the real client the issue names."""
import json
import os
import queue
import subprocess
import threading

from conftest import binary, run


class StatusServer:
    """status_testserver started with `background`; cmd() sends one stdin
    command and waits for its "ok"/"error" reply (sent after the new snapshot
    is published, so a fetch right after sees it)."""

    def __init__(self, background, *args):
        self.bg = background([binary("status_testserver"), *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.proc = self.bg.proc
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        first = self.reply(timeout=10)
        assert first.startswith("ready "), first
        _, port, self.address = first.split()
        self.port = int(port)
        self.base = f"http://127.0.0.1:{self.port}"

    def _pump(self):
        try:
            for line in self.proc.stdout:
                self.lines.put(line.rstrip("\n"))
        except ValueError:
            pass  # the fixture closed the pipe at teardown while this thread read it
        self.lines.put(None)

    def reply(self, timeout=10):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"status_testserver did not answer within {timeout}s") from None
        if line is None:
            raise AssertionError("status_testserver exited: " + (self.proc.stderr.read() or ""))
        return line

    def send(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def cmd(self, command, timeout=10):
        self.send(command)
        r = self.reply(timeout)
        assert r.startswith("ok"), f"{command!r} -> {r!r}"
        return r

    def stats(self):
        r = self.cmd("stats")
        return {k: int(v) for k, v in (kv.split("=") for kv in r.split()[2:])}

    def quit(self, timeout=10):
        self.cmd("quit")
        return self.bg.wait(timeout)


def curl(url, *args, timeout=10):
    """(status code, headers dict (lower-case names), body bytes) from curl -i."""
    r = subprocess.run(["curl", "-s", "-i", "--max-time", str(timeout), *args, url],
                       capture_output=True, timeout=timeout + 5)
    assert r.returncode == 0, f"curl {url} failed ({r.returncode}): {r.stderr!r}"
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    code = int(lines[0].split()[1])
    headers = {}
    for h in lines[1:]:
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()
    return code, headers, body


def get_json(url):
    code, headers, body = curl(url)
    assert code == 200, (code, body)
    assert headers["content-type"] == "application/json"
    return json.loads(body)


def cddpctl(*args, timeout=30):
    return run([binary("cddpctl"), *args], timeout=timeout)


def progress_snippet():
    """The three-line client from docs/status.md, so doc and tests cannot drift."""
    doc = open(os.path.join(os.path.dirname(__file__), "..", "docs", "status.md")).read()
    block = doc.split("<!-- progress-snippet -->")[1].split("<!-- /progress-snippet -->")[0]
    code = block.split("```python\n")[1].split("```")[0]
    assert len(code.strip().splitlines()) == 3
    return code
