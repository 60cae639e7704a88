"""The job dashboard (status/dashboard.h): `/` serves it to browsers and keeps
its plain-text index for everyone else; in a real headless Chromium (Debian's
chromium and chromedriver, driven over the W3C WebDriver HTTP API with
urllib) the page of an agent and of cddp-rdzv loads with no console errors,
shows the workers, the job and its nodes, and its plots grow as the run
progresses.

CDDP_DASHBOARD_SCREENSHOT=PATH saves the agent page's screenshot there,
after 20 s more of history, and cddp-rdzv's beside it (PATH-rdzv.png):
docs/img/dashboard.png and dashboard-rdzv.png were made so.
"""
import base64
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import free_port, wait_for
from statusserver import StatusServer, curl
from test_prometheus import Job

BROWSER_ACCEPT = ("text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,"
                  "image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7")


def test_root_negotiates_text_or_html(background):
    """curl (*/*), text/plain and no Accept keep the plain-text index; a
    browser's Accept gets the page, as does /dashboard whatever is asked;
    the page loads nothing from elsewhere and says so in its CSP."""
    srv = StatusServer(background)
    srv.cmd("state running")
    url = srv.base + "/"
    text = None
    for args in ([], ["-H", "Accept: */*"], ["-H", "Accept: text/plain"], ["-H", "Accept:"]):
        code, headers, body = curl(url, *args)
        assert code == 200 and headers["content-type"] == "text/plain; charset=utf-8", args
        assert headers["vary"] == "Accept"
        assert body.startswith(b"status_testserver status port\n") and b"/metrics" in body
        assert text in (None, body)
        text = body
    pages = [curl(url, "-H", f"Accept: {BROWSER_ACCEPT}"), curl(url, "-H", "Accept: text/html"),
             curl(srv.base + "/dashboard"), curl(srv.base + "/dashboard", "-H", "Accept: text/plain")]
    for code, headers, body in pages:
        assert code == 200 and headers["content-type"] == "text/html; charset=utf-8"
        assert headers["cache-control"] == "no-store"
        assert "default-src 'none'" in headers["content-security-policy"]
        assert body == pages[0][2]
    page = pages[0][2].decode()
    assert pages[0][1]["vary"] == "Accept" and "vary" not in pages[2][1]
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert len(page) < 16 * 1024, len(page)
    # Self-contained: no src= or stylesheet, and no URL but the SVG namespace.
    assert not re.search(r"\bsrc\s*=", page) and "stylesheet" not in page
    assert re.findall(r"https?://[^\s\"']+", page) == ["http://www.w3.org/2000/svg"]
    # HEAD: the same headers, no body.
    r = subprocess.run(["curl", "-s", "-I", "-H", "Accept: text/html", url], capture_output=True,
                       timeout=15)
    assert b"text/html" in r.stdout
    assert curl(srv.base + "/dashboard/x")[0] == 404


# ---- headless Chromium ----

class Browser:
    """chromedriver (W3C WebDriver over HTTP) with one headless Chromium
    session; quit() closes the session and chromedriver (the test's
    `background` fixture kills it in any case)."""

    def __init__(self, background, tmp_path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "chromedriver.log"
        with open(self.log, "w") as fh:
            self.bg = background(["chromedriver", f"--port={self.port}"], stdout=fh,
                                 stderr=subprocess.STDOUT)

        def up():
            try:
                return self.call("GET", "/status")["ready"]
            except OSError:
                return False
        wait_for(up, timeout=30, interval=0.1, what="chromedriver")
        self.session = None
        args = ["--headless=new", "--disable-gpu", "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1280,1000",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--hide-scrollbars"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium's sandbox refuses to run as root
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {"binary": shutil.which("chromium"), "args": args}}}}
        try:
            r = self.call("POST", "/session", caps, timeout=90)
        except AssertionError as e:
            raise AssertionError(f"{e}\nchromedriver's log:\n{self.log.read_text()[-3000:]}") \
                from None
        self.session = r["sessionId"]

    def call(self, method, path, body=None, timeout=30):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            out = json.loads(e.read() or b"{}")
            raise AssertionError(f"WebDriver {method} {path}: {e.code} {out}") from None
        return out["value"]

    def s(self, method, path, body=None, **kw):
        return self.call(method, f"/session/{self.session}{path}", body, **kw)

    def go(self, url):
        self.s("POST", "/url", {"url": url}, timeout=60)

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def console(self):
        """Browser log entries since the last call (console messages, uncaught
        errors, failed loads)."""
        return self.s("POST", "/se/log", {"type": "browser"})

    def screenshot(self):
        return base64.b64decode(self.s("GET", "/screenshot"))

    def quit(self):
        if self.session:
            try:
                self.s("DELETE", "", timeout=30)
            except (OSError, AssertionError):
                pass
            self.session = None
        self.bg.kill()


@pytest.fixture
def browser(background, tmp_path):
    for exe in ("chromium", "chromedriver"):
        if shutil.which(exe) is None:
            pytest.skip(f"{exe} is not installed (tools/setup.sh --test installs "
                        "chromium and chromium-driver)")
    b = Browser(background, tmp_path)
    yield b
    b.quit()


def errors(entries):
    return [e for e in entries if e["level"] in ("SEVERE", "WARNING")]


def page_state(b):
    return b.js("""
        const q = (s) => document.querySelectorAll(s);
        return {polls: Number(document.body.dataset.polls || 0),
                title: document.getElementById('title').textContent,
                conn: document.getElementById('conn').textContent,
                connError: document.getElementById('conn').className === 'err',
                workers: Array.from(q('#workers tbody tr')).map(r => ({
                    local: r.dataset.localRank, state: r.dataset.state,
                    cells: Array.from(r.cells).map(c => c.textContent)})),
                loss: Number(document.getElementById('loss').dataset.points),
                tput: Number(document.getElementById('tput').dataset.points),
                lines: q('#loss polyline').length,
                agentShown: !document.getElementById('agent').classList.contains('hidden'),
                runs: Array.from(q('#runs [data-run]')).map(d => ({
                    run: d.dataset.run, heading: d.querySelector('h3').textContent,
                    nodes: Array.from(d.querySelectorAll('tbody tr')).map(r => r.dataset.node),
                    links: Array.from(d.querySelectorAll('tbody tr a')).map(a => a.href)}))};
    """)


def wait_page(b, pred, what, timeout=30):
    """The page's state once pred(state) holds."""
    def ok():
        st = page_state(b)
        return st if pred(st) else None
    return wait_for(ok, timeout=timeout, interval=0.2, what=what)


@pytest.mark.heavy
def test_dashboard_in_chromium(background, tmp_path, browser):
    """Two agents of two workers each meet on cddp-rdzv; each agent's page
    shows its two workers running, and its loss and throughput plots (one
    line per rank) grow while the workers report; cddp-rdzv's page shows the
    job and both nodes. No console errors, warnings or failed loads."""
    job = Job(background, tmp_path, nnodes=2, nproc=2, env={"PERIOD": "0.25"})
    ports = [job.agent(), job.agent()]
    for p in ports:
        job.wait_agent(p, lambda s: s["state"] == "running" and all(
            w["progress"] for w in s["workers"]), "both workers reporting")

    b = browser
    b.go(f"http://127.0.0.1:{ports[0]}/?interval=0.5")
    st = wait_page(b, lambda s: s["polls"] >= 2 and s["lines"] == 2 and s["loss"] >= 4,
                   "the page's first polls, a plotted line per rank")
    assert st["agentShown"] and st["runs"] == [] and not st["connError"], st
    assert st["title"].startswith("cddprun ") and " on " in st["title"]
    assert [w["local"] for w in st["workers"]] == ["0", "1"]
    assert [w["state"] for w in st["workers"]] == ["running", "running"]
    ranks = sorted(int(w["cells"][1]) for w in st["workers"])
    assert ranks in ([0, 1], [2, 3]), st["workers"]
    # The plots grow as the run goes on (a point per progress line seen).
    first = st["loss"], st["tput"]
    st = wait_page(b, lambda s: s["loss"] >= first[0] + 6 and s["tput"] >= first[1] + 6,
                   "the plots to grow")
    steps = [int(w["cells"][6]) for w in st["workers"]]
    assert all(s > 0 for s in steps), st["workers"]
    save = os.environ.get("CDDP_DASHBOARD_SCREENSHOT")
    if save:
        time.sleep(20)  # a longer history for the picture in docs/status.md
    shot = b.screenshot()
    assert shot.startswith(b"\x89PNG\r\n\x1a\n") and len(shot) > 10000
    if save:
        with open(save, "wb") as fh:
            fh.write(shot)
    assert errors(b.console()) == []

    # cddp-rdzv's page: every job it serves and its nodes.
    b.go(f"http://127.0.0.1:{job.rdzv_status}/?interval=0.5")
    st = wait_page(b, lambda s: s["polls"] >= 1 and s["runs"], "cddp-rdzv's page")
    assert st["title"].startswith("cddp-rdzv ") and not st["agentShown"], st
    (run,) = st["runs"]
    assert run["run"] == "job" and "running" in run["heading"]
    assert len(run["nodes"]) == 2 and len(set(run["nodes"])) == 2
    # Each node links to its agent's page (the status port it told the server).
    assert sorted(run["links"]) == sorted(f"http://127.0.0.1:{p}/dashboard" for p in ports), run
    assert errors(b.console()) == []
    if save:
        with open(re.sub(r"(\.png)?$", "-rdzv.png", save, count=1), "wb") as fh:
            fh.write(b.screenshot())

    # The run ends and the agent goes away: the page says so and keeps what
    # it last showed; only the failed fetches are logged.
    b.go(f"http://127.0.0.1:{ports[1]}/?interval=0.5")
    wait_page(b, lambda s: s["polls"] >= 1 and len(s["workers"]) == 2, "the second agent's page")
    job.stop()
    st = wait_page(b, lambda s: s["connError"], "the page to notice the agent is gone")
    assert st["conn"].startswith("cannot read /status: ") and len(st["workers"]) == 2, st
    logged = errors(b.console())
    assert logged, "the failed fetch is in the browser log"
    for e in logged:
        assert e["source"] == "network" and "ERR_CONNECTION_REFUSED" in e["message"], e
    b.quit()


@pytest.mark.heavy
def test_dashboard_marks_a_straggler(background, browser):
    """A rank the agent names a straggler gets a badge in the workers table
    (its factor in the tooltip); the others do not."""
    srv = StatusServer(background, "--workers", "3")
    srv.cmd("state running")
    for lr in range(3):
        srv.cmd(f'progress {lr} {{"step":{40 + lr}}}')
    srv.cmd("straggler 2 0.3")
    browser.go(srv.base + "/?interval=0.5")
    st = wait_page(browser, lambda s: s["polls"] >= 1 and len(s["workers"]) == 3,
                   "the workers table")
    marks = browser.js("""
        return Array.from(document.querySelectorAll('#workers tbody tr')).map(r => ({
            straggler: r.dataset.straggler,
            badges: Array.from(r.querySelectorAll('.st.straggler')).map(b => b.title)}));""")
    assert [m["straggler"] for m in marks] == ["0", "0", "1"], marks
    assert marks[2]["badges"] == ["x3.00 the median step"] and marks[0]["badges"] == [], marks
    assert [w["state"] for w in st["workers"]] == ["running"] * 3
    assert errors(browser.console()) == []
