"""The job dashboard (status/dashboard.h): `/` serves it to browsers and keeps
its plain-text index for everyone else; in a real headless Chromium (Debian's
chromium and chromedriver, driven over the W3C WebDriver HTTP API with
urllib) the page of an agent and of cddp-rdzv loads with no console errors,
shows the workers, the job and its nodes, and its plots grow as the run
progresses.

The whole run (GET /history): a real cddp-train run with one crash and a
restart, kept on the status port by --status_linger; its history read with
a plain HTTP GET, and a page opened after the run shows every step and the
restart marker.

CDDP_DASHBOARD_SCREENSHOT=PATH saves the agent page's screenshot there,
after 20 s more of history, and cddp-rdzv's beside it (PATH-rdzv.png):
docs/img/dashboard-rdzv.png was made so. CDDP_DASHBOARD_RUN_SCREENSHOT=PATH
saves the page of a longer run with a restart: docs/img/dashboard.png.
"""
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import binary, free_port, wait_for
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
    assert len(page) < 32 * 1024, len(page)
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
                lines: q('#loss polyline[data-ema]').length,
                agentShown: !document.getElementById('agent').classList.contains('hidden'),
                runs: Array.from(q('#runs [data-run]')).map(d => ({
                    run: d.dataset.run, heading: d.querySelector('h3').textContent,
                    nodes: Array.from(d.querySelectorAll('tbody tr')).map(r => r.dataset.node),
                    links: Array.from(d.querySelectorAll('tbody tr a')).map(a => a.href),
                    jobplot: Number((d.querySelector('svg.jobplot') || {dataset: {}})
                                    .dataset.points || 0)}))};
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
    # The job's step against time, from cddp-rdzv's /history?run= (points
    # come with the agents' heartbeats).
    wait_page(b, lambda s: s["runs"] and s["runs"][0]["jobplot"] >= 2, "the job's step plotted")
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


# ---- the whole run: /history ----

def tiny_run(background, tmp_path, steps=6, crash_step=3, wait=True):
    """cddprun (2 ranks, --max_restarts=1, its status port kept 60 s after
    the run) over a tiny CPU cddp-train whose rank 1 crashes at crash_step;
    returns (status port, the agent's Background, its stderr's path) once
    the run has succeeded (wait), or once its status port answers."""
    port = free_port()
    args = [binary("cddprun"), "--nproc_per_node=2", "--standalone", "--max_restarts=1",
            f"--status_port={port}", "--status_linger=60", f"--log_dir={tmp_path / 'logs'}",
            binary("cddp-train"), "--arch", "resnet18", "--data", "synthetic", "--image-size", "16",
            "--num-classes", "10", "--num-samples", str(8 * steps), "--batch-size", "4",
            "--epochs", "1", "--log-every", "1", "--threads", "1",
            "--fault", f"crash@step={crash_step},rank=1"]
    err = tmp_path / "cddprun.err"
    env = dict(os.environ, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="10")
    with open(err, "w") as fh:
        agent = background(args, env=env, stdout=subprocess.DEVNULL, stderr=fh)

    def done():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
                st = json.loads(r.read())
        except OSError:
            return None
        assert st["state"] not in ("failed", "terminated"), err.read_text()[-3000:]
        return st if st["state"] == "succeeded" or not wait else None
    try:
        wait_for(done, timeout=120, interval=0.1, what="the run to succeed")
    except BaseException:
        print(err.read_text()[-3000:])
        raise
    return port, agent, err


def http_get(url):
    """(code, content type, body) by a plain HTTP GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def test_history_of_a_run_with_a_restart(background, tmp_path):
    """After the run: /history holds every step of both attempts of both
    ranks (nothing decimated in a short run), in order, numbered; the
    restart with its reason and the highest step before it, the rounds and
    the end; ?since= gives only what is newer; a bad since= is a 400 with a
    one-line reason; /status names it, without its points."""
    port, agent, err = tiny_run(background, tmp_path)
    base = f"http://127.0.0.1:{port}"
    code, ctype, body = http_get(base + "/history")
    assert code == 200 and ctype == "application/json", (code, body)
    h = json.loads(body)
    assert h["columns"] == ["seq", "t", "step", "loss", "samples_per_s", "step_time_s", "attempt"]
    assert h["capacity"] == 2048 and h["since"] == 0 and h["events_dropped"] == 0
    assert [s["local_rank"] for s in h["series"]] == [0, 1]
    assert [s["rank"] for s in h["series"]] == [0, 1]
    seqs = []
    for s in h["series"]:
        pts = s["points"] + ([s["latest"]] if s["latest"] else [])
        assert s["stride"] == 1 and s["latest"] is None and s["samples"] == len(pts), s
        first = [p[2] for p in pts if p[6] == 0]
        second = [p[2] for p in pts if p[6] == 1]
        # The first attempt got to the crash (rank 1 dies at step 3, rank 0
        # within it), the second ran from the start to the end.
        assert first in ([1, 2], [1, 2, 3]), pts
        assert second == [1, 2, 3, 4, 5, 6], pts
        assert all(isinstance(p[3], float) and p[3] > 0 for p in pts), pts  # loss
        assert all(isinstance(p[4], (int, float)) and p[4] > 0 for p in pts), pts  # samples/s
        ts = [p[1] for p in pts]
        assert ts == sorted(ts) and h["started_at"] <= ts[0] <= h["generated_at"]
        seqs += [p[0] for p in pts]
    kinds = [e["kind"] for e in h["events"]]
    assert kinds == ["round", "restart", "round", "end"], h["events"]
    restart = h["events"][1]
    assert restart["reason"] == "local_rank 1 (rank 1) exited with code 1", restart
    top = max(p[2] for s in h["series"] for p in s["points"] if p[6] == 0)
    assert restart["step"] == top and restart["attempt"] == 0, restart
    assert h["events"][3]["reason"] == "succeeded" and h["events"][2]["value"] == 2
    seqs += [e["seq"] for e in h["events"]]
    assert sorted(seqs) == list(range(1, h["seq"] + 1)), "every number once"

    code, _, body = http_get(f"{base}/history?since={h['seq']}")
    news = json.loads(body)
    assert code == 200 and news["seq"] == h["seq"] and news["events"] == []
    assert all(s["points"] == [] for s in news["series"]), news
    news = json.loads(http_get(f"{base}/history?since={restart['seq']}")[2])
    assert [e["kind"] for e in news["events"]] == ["round", "end"]
    assert all(p[6] == 1 for s in news["series"] for p in s["points"])
    for bad in ("x", "-1", "1e3", ""):
        code, ctype, body = http_get(f"{base}/history?since={bad}")
        assert code == 400 and ctype == "application/json", (bad, code, body)
        assert json.loads(body) == {"error": "since= must be a sequence number (0 or more)"}
    # /status names it and its last number only, not its points.
    code, _, body = http_get(base + "/status")
    assert code == 200 and json.loads(body)["history"] == {"path": "/history", "seq": h["seq"]}
    assert b"\"columns\"" not in body and b"\"series\"" not in body
    code, ctype, body = http_get(base + "/")  # the plain-text index lists it
    assert code == 200 and ctype.startswith("text/plain") and b"\n  /history    " in body, body
    # SIGTERM ends the linger; the run's status stands (under ASan: no report).
    agent.signal(signal.SIGTERM)
    assert agent.wait(30) == 0
    text = err.read_text()
    assert "Sanitizer" not in text and "runtime error:" not in text, text[-3000:]


def plots(browser):
    """What the history plots show (their data attributes) and the events."""
    return browser.js("""
        const out = {};
        for (const id of ['loss', 'tput', 'stime']) {
            const s = document.getElementById(id);
            out[id] = {points: Number(s.dataset.points), mode: s.dataset.mode,
                       min: s.dataset.stepMin, max: s.dataset.stepMax,
                       restarts: Number(s.dataset.restarts),
                       raw: s.querySelectorAll('polyline[data-raw]').length,
                       ema: s.querySelectorAll('polyline[data-ema]').length,
                       marks: Array.from(s.querySelectorAll('g.restart')).map(g => ({
                           reason: g.dataset.reason, title: g.querySelector('title').textContent,
                           label: g.querySelector('text').textContent}))};
        }
        out.events = Array.from(document.querySelectorAll('#events tbody tr')).map(
            r => r.dataset.kind);
        out.info = document.getElementById('histinfo').textContent;
        return out;""")


@pytest.mark.heavy
def test_dashboard_shows_the_whole_run(background, tmp_path, browser):
    """A page opened after a run with one restart plots every step of both
    attempts (against step, and against time), the restart as a marked line
    with its reason on hover, the loss smoothed over its faint raw values,
    and lists the events. No console errors."""
    shot = os.environ.get("CDDP_DASHBOARD_RUN_SCREENSHOT")
    steps, crash = (40, 25) if shot else (6, 3)
    port, _, _ = tiny_run(background, tmp_path, steps=steps, crash_step=crash)
    h = json.loads(http_get(f"http://127.0.0.1:{port}/history")[2])
    npts = sum(len(s["points"]) for s in h["series"])
    browser.go(f"http://127.0.0.1:{port}/?interval=0.5")
    st = wait_page(browser, lambda s: s["polls"] >= 2 and s["loss"] > 0, "the page's first polls")
    assert not st["connError"] and [w["state"] for w in st["workers"]] == ["succeeded"] * 2, st

    p = plots(browser)
    for mode in ("step", "time"):
        loss = p["loss"]
        # Every step of both ranks and attempts, from the first step to the last.
        assert loss["points"] == npts and p["tput"]["points"] == npts, (p, npts)
        assert (loss["mode"], loss["min"], loss["max"]) == (mode, "1", str(steps)), loss
        # A line per rank and attempt: raw (faint) and smoothed.
        assert loss["raw"] == 4 and loss["ema"] == 4 and p["tput"]["ema"] == 0, loss
        assert loss["restarts"] == 1 and len(loss["marks"]) == 1, loss
        (m,) = loss["marks"]
        assert m["reason"] == "local_rank 1 (rank 1) exited with code 1" and m["label"] == "restart 1"
        assert m["title"].startswith("restart after step ") and m["title"].endswith(m["reason"]), m
        assert p["events"] == ["end", "round", "restart", "round"], p["events"]
        assert p["info"] == f" ({npts} points of the whole run)", p["info"]
        if mode == "step":
            browser.js("document.querySelector('#xaxis button[data-x=time]').click();")
            p = plots(browser)
    if shot:
        browser.js("document.querySelector('#xaxis button[data-x=step]').click();")
        browser.s("POST", "/window/rect", {"width": 1280, "height": 1400})
        with open(shot, "wb") as fh:
            fh.write(browser.screenshot())
    assert errors(browser.console()) == []


@pytest.mark.heavy
def test_dashboard_follows_a_run_from_its_start(background, tmp_path, browser):
    """A page opened while the run starts, polling as it goes (the history
    in pieces, ?since=), ends with what a fresh load of /history has: every
    point once, the restart marked."""
    port, _, err = tiny_run(background, tmp_path, wait=False)
    browser.go(f"http://127.0.0.1:{port}/?interval=0.2")
    st = wait_page(browser, lambda s: s["workers"] and s["workers"][0]["state"] == "succeeded",
                   "the run to succeed on the page", timeout=120)
    h = json.loads(http_get(f"http://127.0.0.1:{port}/history")[2])
    npts = sum(len(s["points"]) for s in h["series"])
    polls = st["polls"]
    wait_page(browser, lambda s: s["polls"] >= polls + 2, "two more polls")
    p = plots(browser)
    # It came in pieces: the whole history once, then news (the run lasts seconds).
    fetches = int(browser.js("return document.body.dataset.historyFetches;"))
    assert fetches >= 3, fetches
    assert p["loss"]["points"] == npts and p["loss"]["restarts"] == 1, (p, npts)
    assert (p["loss"]["min"], p["loss"]["max"]) == ("1", "6"), p["loss"]
    assert p["events"] == ["end", "round", "restart", "round"], p["events"]
    assert errors(browser.console()) == [], err.read_text()[-2000:]
