"""A real Prometheus (Debian's) scrapes a running cddprun agent and cddp-rdzv;
and the Grafana dashboard in examples/grafana/ asks only for metrics that
exist.

The job: cddp-rdzv with its status port, one or two cddprun agents meeting
there (c10d), each with Python workers that report progress lines (the
documented snippet, docs/status.md) and then hold still, so the values the
job had can be compared exactly with what Prometheus stored.

What is asserted: Prometheus' own view of both targets (/api/v1/targets:
health "up", lastError empty, after two scrapes), `up` == 1 for both, and the
cddp_* series with the values the agent's /status had: workers by state,
restarts by reason, every worker's step, loss and throughput, the round, and
on cddp-rdzv the run's members and round. Every expression of the dashboard
runs through that Prometheus and returns data. Without Prometheus the
scrape test skips (tools/setup.sh --test installs it).

Also used by test_dashboard.py (the Job helper and its worker).
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request

import pytest

import promparse
from conftest import ROOT, binary, free_port, wait_for
from statusserver import curl, progress_snippet

PROM_CTYPE = "text/plain; version=0.0.4; charset=utf-8"
DASHBOARD = ROOT / "examples" / "grafana" / "cddp-job.json"
FAST = "keep_alive_interval=0.2,keep_alive_max_attempt=3,last_call_timeout=0.5"

# A worker that trains nothing but reports like one: a falling, noisy loss
# and a throughput, one line every $PERIOD seconds for $STEPS steps, then
# holds still until $D/stop exists (then exits 0). With $FAIL_AT, global rank
# 0 of the first attempt exits 1 after that step, so the agent restarts the
# group once.
WORKER = progress_snippet() + r"""
import math, os, pathlib, random, time
d = pathlib.Path(os.environ["D"])
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
steps = int(os.environ.get("STEPS", "1000000"))
period = float(os.environ.get("PERIOD", "0.2"))
fail_at = int(os.environ.get("FAIL_AT", "-1"))
rng = random.Random(1000 * rank + attempt)
for step in range(steps):
    loss = 2.2 * math.exp(-step / 25.0) + 0.1 + 0.04 * rank + 0.05 * rng.random()
    report(step=step, epoch=step // 20, loss=loss,
           samples_per_s=round(180.0 + 15 * rank + 20 * rng.random(), 3))
    if attempt == 0 and rank == 0 and step == fail_at:
        raise SystemExit(1)
    if (d / "stop").exists():
        break
    time.sleep(period)
while not (d / "stop").exists():
    time.sleep(0.05)
"""


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def status(port):
    """The /status JSON, or None while nothing is served."""
    try:
        code, body = get(f"http://127.0.0.1:{port}/status", timeout=5)
    except OSError:
        return None
    return json.loads(body) if code == 200 else None


def metrics(port):
    code, headers, body = curl(f"http://127.0.0.1:{port}/metrics")
    assert code == 200 and headers["content-type"] == PROM_CTYPE
    return promparse.parse(body.decode(), conventions=True)


class Job:
    """cddp-rdzv (with a status port) and agents that meet there. Everything
    runs under the test's `background` fixture, so it is torn down."""

    def __init__(self, background, tmp_path, nnodes=1, nproc=2, run_id="job", env=None):
        self.background, self.tmp = background, tmp_path
        self.nnodes, self.nproc, self.run_id = nnodes, nproc, run_id
        self.env = dict(os.environ, D=str(tmp_path), TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5",
                        **(env or {}))
        self.worker = tmp_path / "worker.py"
        self.worker.write_text(WORKER)
        self.rdzv_port, self.rdzv_status = free_port(), free_port()
        self.rdzv_log = tmp_path / "rdzv.log"
        with open(self.rdzv_log, "w") as fh:
            self.rdzv = background([binary("cddp-rdzv"), "--host", "127.0.0.1", "--port",
                                    self.rdzv_port, "--status-port", self.rdzv_status],
                                   stdout=fh, stderr=subprocess.STDOUT)
        wait_for(lambda: status(self.rdzv_status), timeout=20, what="cddp-rdzv's /status")
        self.agents = []  # (status port, Background, log path)

    def agent(self, *extra):
        port = free_port()
        log = self.tmp / f"agent{len(self.agents)}.log"
        args = [binary("cddprun"), f"--nnodes={self.nnodes}", f"--nproc_per_node={self.nproc}",
                "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{self.rdzv_port}",
                f"--rdzv_id={self.run_id}", f"--rdzv_conf=is_host=0,{FAST}",
                f"--status_port={port}", *extra, self.worker]
        with open(log, "w") as fh:
            bg = self.background(args, env=self.env, stdout=fh, stderr=subprocess.STDOUT)
        self.agents.append((port, bg, log))
        return port

    def wait_agent(self, port, pred, what, timeout=40):
        def ok():
            st = status(port)
            return st if st and pred(st) else None
        try:
            return wait_for(ok, timeout=timeout, what=what)
        except BaseException:
            for _, _, log in self.agents:
                print(f"---- {log}\n{log.read_text(errors='replace')[-3000:]}")
            raise

    def stop(self, timeout=30):
        """Lets the workers finish: every agent exits 0; then cddp-rdzv is
        stopped with SIGTERM and exits 0. Nobody's log has a sanitizer's
        report (under ASan)."""
        (self.tmp / "stop").write_text("")
        for _, bg, log in self.agents:
            assert bg.wait(timeout) == 0, log.read_text(errors="replace")[-3000:]
        self.rdzv.signal(signal.SIGTERM)
        assert self.rdzv.wait(timeout) == 0, self.rdzv_log.read_text(errors="replace")[-3000:]
        for log in [self.rdzv_log] + [log for _, _, log in self.agents]:
            text = log.read_text(errors="replace")
            for mark in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
                assert mark not in text, f"{log.name}: {mark}\n{text[-3000:]}"


# ---- the Grafana dashboard's metric names ----

# PromQL words that are not metric names.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
            "and", "or", "unless", "inf", "nan"}


def promql_metrics(expr):
    """The metric names an expression selects. Label matchers ({...}), ranges
    ([...]), strings, label lists after by/without/on/ignoring/group_*,
    function names (a word before "(") and numbers are not; label_values(m,
    label)'s label is not either."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"'(?:[^'\\]|\\.)*'", "''", e)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\blabel_values\s*\(([^,()]*),[^)]*\)", r"(\1)", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        before = e[m.start() - 1] if m.start() else ""
        after = e[m.end():].lstrip()
        if after.startswith("(") or word.lower() in KEYWORDS or before.isdigit() or before == ".":
            continue
        if word.startswith("$"):
            continue
        names.add(word)
    return names


def test_promql_metrics_extraction():
    """The extractor finds the metric names, and only them (so the next test
    can fail)."""
    assert promql_metrics('sum by (state) (cddp_agent_workers{instance=~"$instance"})') == {
        "cddp_agent_workers"}
    assert promql_metrics('time() - cddp_a{x="y,z"} / on(instance) group_left(run_id) cddp_b') \
        == {"cddp_a", "cddp_b"}
    assert promql_metrics("rate(cddp_x_total[$__rate_interval]) > 1.5e3 or vector(0)") == {
        "cddp_x_total"}
    assert promql_metrics('label_values(cddp_agent_info{run_id=~"$run_id"}, instance)') == {
        "cddp_agent_info"}
    assert promql_metrics("cddp_nope_seconds == 1") == {"cddp_nope_seconds"}


def dashboard_exprs(dash):
    """Every PromQL expression of the dashboard: the panels' targets and the
    query variables'. (panel title, expr)."""
    out = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"]))
    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"${v['name']}", q))
    return out


def test_grafana_dashboard_is_well_formed():
    """Grafana's dashboard schema, as far as an import needs it: unique panel
    ids, a grid position inside the 24 columns, no two panels on the same
    cells, every target a Prometheus query with a refId on the template's
    data source, every variable a panel uses defined."""
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "run_id", "instance"} <= names
    ids, cells = set(), {}
    for p in dash["panels"]:
        assert p["id"] not in ids
        ids.add(p["id"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for cx in range(g["x"], g["x"] + g["w"]):
            for cy in range(g["y"], g["y"] + g["h"]):
                assert (cx, cy) not in cells, f"{p['title']} overlaps {cells[(cx, cy)]}"
                cells[(cx, cy)] = p["title"]
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat", "table", "gauge", "state-timeline"), p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"]
            for var in re.findall(r"\$(\w+)", t["expr"]):
                assert var in names or var.startswith("__"), (p["title"], var)


def test_grafana_dashboard_uses_live_metrics(background, tmp_path):
    """Every metric name in the dashboard's PromQL is served on a live
    /metrics: an agent's (with workers that report progress) or cddp-rdzv's.
    And the dashboard covers the families the issue names."""
    job = Job(background, tmp_path, env={"STEPS": "3", "PERIOD": "0.05"})
    port = job.agent()
    job.wait_agent(port, lambda s: s["state"] == "running" and all(
        w["progress"] and w["progress"]["step"] == 2 for w in s["workers"]), "progress lines")
    served = {"cddprun": set(metrics(port)), "cddp-rdzv": set(metrics(job.rdzv_status))}
    every = served["cddprun"] | served["cddp-rdzv"]
    used = {}
    for title, expr in dashboard_exprs(json.loads(DASHBOARD.read_text())):
        names = promql_metrics(expr)
        assert names, f"{title}: no metric in {expr!r}"
        for n in names:
            used.setdefault(n, title)
    missing = {n: t for n, t in used.items() if n not in every}
    assert not missing, f"dashboard metrics that no status port serves: {missing}"
    # The rendezvous panels come from cddp-rdzv's own port (this agent hosts none).
    assert {n for n in used if n.startswith("cddp_rdzv_")} <= served["cddp-rdzv"]
    for n in ("cddp_agent_workers", "cddp_agent_restarts_total", "cddp_worker_progress_step",
              "cddp_worker_loss", "cddp_worker_samples_per_second", "cddp_rdzv_members"):
        assert n in used, f"the dashboard does not show {n}"
    job.stop()


# ---- a real Prometheus ----

class Prometheus:
    """Debian's prometheus on a free loopback port, its storage in tmp."""

    def __init__(self, background, tmp_path, targets):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        jobs = "".join(
            f"  - job_name: {name}\n    static_configs:\n      - targets: ['127.0.0.1:{p}']\n"
            for name, p in targets.items())
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                       "  evaluation_interval: 1s\nscrape_configs:\n" + jobs)
        self.log = tmp_path / "prometheus.log"
        with open(self.log, "w") as fh:
            self.bg = background(["prometheus", f"--config.file={cfg}",
                                  f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                  f"--web.listen-address=127.0.0.1:{self.port}",
                                  "--log.level=warn"],
                                 stdout=fh, stderr=subprocess.STDOUT, cwd=tmp_path)

        def ready():
            if self.bg.proc.poll() is not None:
                pytest.fail("prometheus exited: " + self.log.read_text()[-2000:])
            try:
                return get(self.base + "/-/ready", timeout=2)[0] == 200
            except OSError:
                return False
        wait_for(ready, timeout=60, interval=0.2, what="prometheus /-/ready")

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params)
        code, body = get(url)
        out = json.loads(body)
        assert out["status"] == "success", out
        return out["data"]

    def query(self, expr):
        """[(labels, value)] of an instant query."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def one(self, expr):
        r = self.query(expr)
        assert len(r) == 1, f"{expr}: {r}"
        return r[0][1]


def close(a, b):
    return a == b or (math.isfinite(a) and abs(a - b) <= 1e-9 * max(1.0, abs(b)))


@pytest.mark.heavy
def test_prometheus_scrapes_agent_and_rdzv(background, tmp_path):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (tools/setup.sh --test installs it)")
    # Rank 0 fails after step 1 once; the restarted group reports steps 0..4
    # and holds still.
    job = Job(background, tmp_path, env={"STEPS": "5", "PERIOD": "0.05", "FAIL_AT": "1"})
    port = job.agent("--max_restarts=2")
    job.wait_agent(port, lambda s: s["state"] == "running" and s["restarts"]["count"] == 1
                   and all(w["progress"] and w["progress"]["step"] == 4
                           for w in s["workers"]), "the restarted group at step 4")
    prom = Prometheus(background, tmp_path, {"cddprun": port, "cddp-rdzv": job.rdzv_status})

    # Two scrapes of each target, both healthy.
    def scraped_twice():
        r = prom.query("count_over_time(up[1m])")
        return len(r) == 2 and all(v >= 2 for _, v in r)
    wait_for(scraped_twice, timeout=60, interval=0.25, what="two scrapes of both targets")
    targets = prom.api("targets")["activeTargets"]
    assert sorted(t["labels"]["job"] for t in targets) == ["cddp-rdzv", "cddprun"]
    for t in targets:
        assert (t["health"], t["lastError"]) == ("up", ""), t
        assert t["scrapeUrl"].endswith("/metrics")
    assert {m["job"]: v for m, v in prom.query("up")} == {"cddprun": 1.0, "cddp-rdzv": 1.0}
    # Nothing Prometheus refused or had to drop while parsing our text.
    for expr in ("scrape_samples_post_metric_relabeling", "scrape_samples_scraped"):
        assert all(v > 10 for _, v in prom.query(expr)), expr

    # The values the job had (it holds still, so /status now is what was scraped).
    now = status(port)
    assert [w["progress"]["step"] for w in now["workers"]] == [4, 4]
    a = '{job="cddprun"}'
    assert prom.one('cddp_agent_workers{job="cddprun",state="running"}') == 2
    assert prom.one(f"sum(cddp_agent_workers{a})") == now["local_world_size"] == 2
    assert prom.one('cddp_agent_restarts_total{reason="worker_failure"}') == 1
    assert prom.one('cddp_agent_restarts_total{reason="membership_change"}') == 0
    assert prom.one('cddp_agent_worker_exits_total{reason="failure"}') == 1
    assert prom.one('cddp_agent_state{state="running"}') == 1
    assert prom.one(f"cddp_agent_world_size{a}") == now["world_size"] == 2
    assert prom.one(f"cddp_agent_rdzv_round{a}") == now["round"]
    for w in now["workers"]:
        lr = f'{{local_rank="{w["local_rank"]}"}}'
        p = w["progress"]
        assert prom.one(f"cddp_worker_progress_step{lr}") == p["step"] == 4
        assert close(prom.one(f"cddp_worker_loss{lr}"), p["loss"])
        assert close(prom.one(f"cddp_worker_samples_per_second{lr}"), p["samples_per_s"])
        assert prom.one(f"cddp_worker_progress_lines_total{lr}") == p["lines"]
    # docs/status.md's join: workers by run.
    joined = prom.query("cddp_worker_loss * on(instance) group_left(run_id) cddp_agent_info")
    assert sorted((m["run_id"], m["local_rank"]) for m, _ in joined) == [("job", "0"), ("job", "1")]
    # The rendezvous server's side of the same job.
    rd = status(job.rdzv_status)
    (run,) = rd["runs"]
    assert prom.one('cddp_rdzv_members{run_id="job"}') == len(run["members"]) == 1
    assert prom.one('cddp_rdzv_round{run_id="job"}') == run["round"] == now["round"]
    assert prom.one("cddp_rdzv_runs") == 1
    assert prom.one("cddp_rdzv_rounds_total") == rd["rounds_total"] >= 1
    assert prom.one('cddp_build_info{job="cddp-rdzv",program="cddp-rdzv"}') == 1

    # Every query of the Grafana dashboard runs here and finds data.
    subst = {"$__rate_interval": "10s", "$instance": ".*", "$run_id": ".*"}
    for title, expr in dashboard_exprs(json.loads(DASHBOARD.read_text())):
        for k, v in subst.items():
            expr = expr.replace(k, v)
        m = re.match(r"label_values\((.*),\s*(\w+)\)\Z", expr)
        if m:
            vals = prom.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)})
            assert vals, f"{title}: {expr} found no values"
            continue
        assert prom.query(expr), f"{title}: {expr} returned no data"
    job.stop()
    prom.bg.kill()
