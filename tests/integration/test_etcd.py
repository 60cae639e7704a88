"""cddprun's etcd-v3 rendezvous over real etcd members (Debian's etcd-server).

The fixture starts one or three etcd members on free loopback ports, each
in its own data directory, and kills them at teardown whatever happened;
without /usr/bin/etcd every test here skips. Agents are real cddprun
processes ("nodes" told apart by NODE), their workers the recording shell
script of test_elastic.py, or cddp-train, or the seed DDP script.

What is asserted: 2-4 agents form one world over etcd and the job's end
closes the run (the state key says closed, with a lease, so the run id can
be used again); `etcd` as a name gives one notice line; a SIGKILLed agent's
lease expires and the survivors run a new round within its TTL; a late
agent scales the job up; cddp-train and the seed DDP script train across
agents; in a 3-member cluster, killing the leader or a follower during
training restarts no worker; killing two members leaves the workers running
until quorum returns, and past join_timeout without quorum the agents stop
with one line saying so; an unreachable etcd at start and a TLS certificate
the agents do not trust are clear errors; TLS with client certificates from
a CA made here with openssl works.
"""
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import urllib.request

import pytest

from conftest import ROOT, binary, free_port, wait_for
from test_elastic import (alive, check_world, cluster, envs, rounds, snapshot,  # noqa: F401
                          wait_round)

EXIT_INFRA = 5  # cddprun: the rendezvous lost or closed under the node (docs/cli.md)

ETCD = "/usr/bin/etcd"
# TTL = keep_alive_interval x keep_alive_max_attempt = 3 s.
FAST = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1"

pytestmark = pytest.mark.skipif(not os.access(ETCD, os.X_OK),
                                reason="etcd is not installed (tools/setup.sh installs etcd-server)")


class Member:
    def __init__(self, background, root, name, client, peer, cluster, tls):
        self.name, self.client, self.peer = name, client, peer
        self.background, self.tls = background, tls
        self.dir = root / name
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{client}"
        self.cmd = [ETCD, "--name", name, "--data-dir", str(self.dir),
                    "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                    "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", cluster, "--initial-cluster-token", "cddp-test",
                    "--initial-cluster-state", "new", "--log-outputs", "stderr"]
        if tls:
            self.cmd += ["--cert-file", tls["server_cert"], "--key-file", tls["server_key"],
                         "--trusted-ca-file", tls["ca"], "--client-cert-auth"]
        self.log = root / f"{name}.log"
        self.bg = None

    def start(self):
        fh = open(self.log, "a")
        self.bg = self.background(self.cmd, stdout=subprocess.DEVNULL, stderr=fh)
        fh.close()

    def kill(self):
        self.bg.proc.send_signal(signal.SIGKILL)
        self.bg.proc.wait(timeout=10)

    def post(self, path, body, timeout=2):
        ctx = None
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.tls["ca"])
            ctx.load_cert_chain(self.tls["client_cert"], self.tls["client_key"])
        req = urllib.request.Request(f"{self.url}/v3/{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return json.load(r)

    def status(self):
        try:
            return self.post("maintenance/status", {})
        except OSError:
            return None


class Etcd:
    def __init__(self, members):
        self.members = members

    @property
    def endpoints(self):
        return ",".join(f"127.0.0.1:{m.client}" for m in self.members)

    def wait_ready(self, timeout=30):
        def ready():
            for m in self.members:
                if m.bg.proc.poll() is not None:
                    pytest.fail(f"etcd {m.name} exited:\n{m.log.read_text()[-3000:]}")
            try:
                # a write goes through only with a leader and quorum
                self.members[0].post("kv/put", {"key": "L3JlYWR5", "value": "MQ=="}, timeout=2)
                return all(m.status() for m in self.members)
            except OSError:
                return False
        wait_for(ready, timeout=timeout, interval=0.2, what="etcd to serve")

    def leader(self):
        for m in self.members:
            s = m.status()
            if s and s.get("leader") == s["header"]["member_id"]:
                return m
        return None

    def get(self, key):
        r = self.members[0].post("kv/range", {"key": base64.b64encode(key.encode()).decode()})
        kvs = r.get("kvs", [])
        return (base64.b64decode(kvs[0].get("value", "")).decode(), kvs[0]) if kvs else None


def make_tls(d):
    """A test CA, a server certificate for 127.0.0.1 and a client certificate.
    The server's may be used as a client's too: with --client-cert-auth,
    etcd's JSON gateway dials its own gRPC port with it."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (tools/setup.sh installs it)")
    d.mkdir()
    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
         "-subj", "/CN=cddp test CA")
    for who, ext in (("server",
                      "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
                     ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{who}.ext").write_text(ext + "\n")
        ossl("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}")
        ossl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{who}.pem", "-days", "2", "-extfile", f"{who}.ext")
    # another CA, which signed nothing of ours
    ossl("req", "-x509", *ec, "-keyout", "other.key", "-out", "other.pem", "-days", "2",
         "-subj", "/CN=someone else")
    return {"ca": str(d / "ca.pem"), "server_cert": str(d / "server.pem"),
            "server_key": str(d / "server.key"), "client_cert": str(d / "client.pem"),
            "client_key": str(d / "client.key"), "other_ca": str(d / "other.pem")}


@pytest.fixture
def etcd(background, tmp_path):
    """etcd(n=1, tls=False) -> Etcd: n members, started and serving."""
    def start(n=1, tls=None):
        root = tmp_path / "etcd"
        root.mkdir(exist_ok=True)
        ports = [(free_port(), free_port()) for _ in range(n)]
        peers = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
        members = [Member(background, root, f"m{i}", c, p, peers, tls)
                   for i, (c, p) in enumerate(ports)]
        for m in members:
            m.start()
        e = Etcd(members)
        e.wait_ready()
        return e
    return start


def v3(endpoints, nnodes, nproc=2, conf=FAST, run_id="job", backend="etcd-v3", **kw):
    args = [f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", f"--rdzv_backend={backend}",
            f"--rdzv_endpoint={endpoints}", f"--rdzv_id={run_id}"]
    if conf:
        args.append(f"--rdzv_conf={conf}")
    for k, v in kw.items():
        args.append(f"--{k}={v}")
    return args


# ---- one member ----

@pytest.mark.parametrize("nproc", [[2, 2], [1, 2, 1, 2]], ids=["2x2", "4-nodes-mixed"])
def test_agents_form_one_world_and_close_the_run(etcd, cluster, nproc):
    e = etcd(1)
    n = len(nproc)
    agents = [cluster.agent(str(i), *v3(e.endpoints, n, nproc=p,
                                      backend="etcd" if i == 0 else "etcd-v3"),
                          env={"LIFETIME": "0.5"})
              for i, p in enumerate(nproc)]
    for a in agents:
        assert a.wait() == 0, a.text()[-3000:]
    (r,) = rounds(cluster.out)
    check_world(r, n, nproc)
    assert r[0]["TORCHELASTIC_RESTART_COUNT"] == "0"
    # `etcd` is a name for etcd-v3: one notice line, from that agent only
    notice = [line for line in agents[0].text().splitlines() if "A2000" in line]
    assert len(notice) == 1 and "etcd-v3" in notice[0], agents[0].text()[-2000:]
    assert "A2000" not in agents[1].text()
    # The network interface is chosen towards the first etcd member, as
    # c10d's towards its endpoint (here loopback: nothing to set).
    why = [line for line in agents[1].text().splitlines() if "A2101" in line]
    assert len(why) == 1 and "127.0.0.1" in why[0], agents[1].text()[-2000:]
    # The job's end closed the run: the state key says so, on a lease
    # (close_timeout), so the run id can be used again once it expires.
    value, kv = e.get("/cddp/rdzv/job/state")
    st = json.loads(value)
    assert st["phase"] == "closed" and st["closed_reason"]
    assert int(kv.get("lease", "0")) != 0
    # Every node's lease was revoked when it left: no node key remains.
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    r = e.members[0].post("kv/range", {"key": b64(b"/cddp/rdzv/job/nodes/"),
                                       "range_end": b64(b"/cddp/rdzv/job/nodes0")})
    assert r.get("kvs", []) == []


def test_status_shows_the_member_lease_and_watch(etcd, cluster):
    from promparse import parse as prom_parse
    e = etcd(1)
    port = free_port()
    a = cluster.agent("0", *v3(e.endpoints, 1), f"--status_port={port}")
    wait_round(cluster.out, 2, timeout=30)

    def get(path):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.read().decode()
    st = wait_for(lambda: json.loads(get("/status")), what="/status")
    rd = st["rdzv"]
    assert rd["backend"] == "etcd-v3"
    assert rd["etcd"] == {"member": e.endpoints, "lease_ok": True, "watch_ok": True,
                          "failovers": 0}
    assert rd["connected"] is True
    metrics = get("/metrics")
    assert f'cddp_agent_rdzv_etcd_lease_ok{{member="{e.endpoints}"}} 1' in metrics
    assert f'cddp_agent_rdzv_etcd_watch_ok{{member="{e.endpoints}"}} 1' in metrics
    prom_parse(metrics, conventions=True)
    # etcd gone: the lease's health says so (the workers run on)
    e.members[0].kill()
    wait_for(lambda: json.loads(get("/status"))["rdzv"]["etcd"]["lease_ok"] is False,
             timeout=20, what="lease_ok false")
    a.signal(signal.SIGTERM)
    assert a.wait() == 128 + signal.SIGTERM


def test_closed_run_refuses_late_agents_then_expires(etcd, cluster):
    e = etcd(1)
    conf = FAST + ",close_timeout=2"
    a = cluster.agent("0", *v3(e.endpoints, 1, conf=conf), env={"LIFETIME": "0.2"})
    assert a.wait() == 0, a.text()[-2000:]
    late = cluster.agent("1", *v3(e.endpoints, 1, conf=conf))
    assert late.wait() == EXIT_INFRA
    assert "closed" in late.text(), late.text()[-2000:]
    # after close_timeout the run id is free again
    wait_for(lambda: e.get("/cddp/rdzv/job/state") is None, timeout=15,
             what="the closed run's state to expire")
    again = cluster.agent("2", *v3(e.endpoints, 1, conf=conf), env={"LIFETIME": "0.2"})
    assert again.wait() == 0, again.text()[-2000:]


def test_two_jobs_in_one_etcd_are_isolated(etcd, cluster):
    e = etcd(1)
    a = cluster.agent("a", *v3(e.endpoints, 1, run_id="one"), env={"LIFETIME": "0.5"})
    b = cluster.agent("b", *v3(e.endpoints, 1, run_id="one",
                             conf=FAST + ",key_prefix=/other"), env={"LIFETIME": "0.5"})
    assert a.wait() == 0 and b.wait() == 0
    rs = rounds(cluster.out)
    assert len(rs) == 2 and all(len(r) == 2 and r[0]["WORLD_SIZE"] == "2" for r in rs)
    assert e.get("/other/one/state") is not None and e.get("/cddp/rdzv/one/state") is not None


def test_sigkill_agent_survivors_new_round_within_ttl(etcd, cluster):
    e = etcd(1)
    agents = [cluster.agent(str(i), *v3(e.endpoints, "2:3")) for i in range(3)]
    first = wait_round(cluster.out, 6, timeout=30)
    check_world(first, 3, [2, 2, 2])
    before = snapshot(cluster.out)
    t0 = time.monotonic()
    agents[2].signal(signal.SIGKILL)
    second = wait_round(cluster.out, 4, ignore=before, timeout=30)
    took = time.monotonic() - t0
    check_world(second, 2, [2, 2])
    assert {x["NODE"] for x in second} == {"0", "1"}
    assert {x["TORCHELASTIC_RESTART_COUNT"] for x in second} == {"0"}
    # the lease TTL (3 s) plus the survivors' restart, with room for a
    # loaded machine
    assert took < 12, took
    assert "lease expired" in agents[0].text()
    for a in agents[:2]:
        a.signal(signal.SIGTERM)
        assert a.wait() == 128 + signal.SIGTERM


def test_late_agent_scales_up_and_one_beyond_max_waits(etcd, cluster):
    e = etcd(1)
    a = cluster.agent("0", *v3(e.endpoints, "2:3"))
    b = cluster.agent("1", *v3(e.endpoints, "2:3"))
    wait_round(cluster.out, 4, timeout=30)
    before = snapshot(cluster.out)
    c = cluster.agent("2", *v3(e.endpoints, "2:3"))
    second = wait_round(cluster.out, 6, ignore=before, timeout=30)
    check_world(second, 3, [2, 2, 2])
    assert "joined (scale-up)" in a.text()
    before = snapshot(cluster.out)
    d = cluster.agent("3", *v3(e.endpoints, "2:3"))
    d.wait_log("waits for a place", timeout=20)
    time.sleep(1)
    assert snapshot(cluster.out) == before
    c.signal(signal.SIGKILL)
    third = wait_round(cluster.out, 6, ignore=before, timeout=30)
    assert {x["NODE"] for x in third} == {"0", "1", "3"}
    for x in (a, b, d):
        x.signal(signal.SIGTERM)
        assert x.wait() == 128 + signal.SIGTERM


def test_worker_failure_restarts_every_node_counted_once(etcd, cluster):
    e = etcd(1)
    env = {"FAIL_RANK": "3", "FAIL_COUNT": "1", "LIFETIME": "1"}
    a = cluster.agent("0", *v3(e.endpoints, 2, max_restarts=1), env=env)
    b = cluster.agent("1", *v3(e.endpoints, 2, max_restarts=1), env=env)
    assert a.wait() == 0, a.text()[-3000:]
    assert b.wait() == 0, b.text()[-3000:]
    # By restart count, not by MASTER_PORT: rank 3 fails at once, so the
    # other agent may see round 1 only after it restarted; it then skips it
    # (A2016) and joins round 2, whose node 0 (and port) can be the same.
    by = {}
    for x in envs(cluster.out):
        by.setdefault(x["TORCHELASTIC_RESTART_COUNT"], []).append(x)
    assert sorted(by) == ["0", "1"], by
    assert "3" in {x["RANK"] for x in by["0"]}
    check_world(by["1"], 2, [2, 2])
    # The failure was counted once (restart 1), by every node alike.
    for ag in (a, b):
        assert "restart count 1/1" in ag.text(), ag.text()[-2000:]


def test_unreachable_etcd_is_a_clear_error(cluster):
    port = free_port()
    a = cluster.agent("0", *v3(f"127.0.0.1:{port}", 2, conf="join_timeout=3"))
    assert a.wait(timeout=60) == EXIT_INFRA
    text = a.text()
    assert "within join_timeout (3 s)" in text, text[-2000:]
    assert f"127.0.0.1:{port}" in text
    assert envs(cluster.out) == []


def test_without_libcurl_the_backend_is_one_clear_line(cluster, tmp_path):
    """libcurl is opened by the etcd backend when it starts (common/dl.h), not
    at exec. A libcurl.so.4 that cannot be loaded is put first on the
    loader's path (LD_LIBRARY_PATH: the real binary, no test-only switch in
    it; an empty file, which the loader refuses): the etcd backend stops
    with one line naming the library and the flag, exit 1 like any other
    rendezvous that cannot open, no worker started, nothing left behind (the
    autouse no_orphans fixture); a run without etcd never notices."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libcurl.so.4").write_bytes(b"")
    env = {"LD_LIBRARY_PATH": str(lib), "LIFETIME": "0"}
    a = cluster.agent("0", *v3(f"127.0.0.1:{free_port()}", 1), env=env)
    assert a.wait(timeout=30) == 1
    errors = [line for line in a.text().splitlines() if " ERROR " in line]
    assert len(errors) == 1, a.text()[-2000:]
    assert ("A0603: --rdzv_endpoint: the etcd backend (--rdzv_backend=etcd-v3) needs libcurl: "
            f"libcurl.so.4 cannot be loaded ({lib}/libcurl.so.4: ") in errors[0], errors[0]
    assert envs(cluster.out) == []
    ok = cluster.agent("1", "--nproc_per_node=2", env=env)
    assert ok.wait(timeout=30) == 0, ok.text()[-2000:]
    assert len(envs(cluster.out)) == 2


@pytest.mark.parametrize("answer", ["junk", "deep", "huge", "wrong-types"])
def test_misbehaving_endpoint_is_an_error_not_a_crash(cluster, answer):
    """A 'member' that answers nonsense: the agent says what it got, gives
    up after join_timeout and exits 1 (ASan builds: no error either)."""
    bodies = {
        "junk": b"{this is not json",
        "deep": b"[" * 100000,
        "huge": b'{"header":{"revision":"1"},"x":"' + b"a" * (9 << 20) + b'"}',
        "wrong-types": b'{"header":{"revision":[1]},"ID":{},"TTL":"x","kvs":7}',
    }

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = bodies[answer]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        a = cluster.agent("0", *v3(f"127.0.0.1:{srv.server_port}", 1, conf="join_timeout=2"))
        assert a.wait(timeout=60) == EXIT_INFRA
        text = a.text()
        assert "within join_timeout (2 s)" in text, text[-2000:]
        said = {"junk": "not a JSON object", "deep": "nested deeper",
                "huge": "longer than", "wrong-types": "etcd answer"}[answer]
        line = [ln for ln in text.splitlines() if "A0101" in ln]
        assert len(line) == 1 and said in line[0], text[-2000:]
    finally:
        srv.shutdown()
        srv.server_close()


def test_cddp_train_over_etcd(etcd, cluster, tmp_path):
    e = etcd(1)
    small = ["--arch", "resnet18", "--data", "synthetic", "--image-size", "32", "--num-classes",
             "10", "--epochs", "1", "--log-every", "1", "--num-samples", "16", "--batch-size", "4"]
    agents = [cluster.agent(str(i), *v3(e.endpoints, 2, nproc=1), script=binary("cddp-train"),
                          script_args=small, env={"OMP_NUM_THREADS": "1"})
              for i in range(2)]
    for a in agents:
        assert a.wait(timeout=180) == 0, a.text()[-3000:]


@pytest.mark.heavy
def test_seed_ddp_script_over_etcd(etcd, cluster, torch_python, tmp_path):
    e = etcd(1)
    out = tmp_path / "ddp"
    out.mkdir()
    script = ROOT / "tests" / "compat" / "ddp_train.py"
    agents = [cluster.agent(str(i), *v3(e.endpoints, 2, nproc=1), script=script,
                          script_args=["--out", out], env={"PYTHON_EXEC": torch_python})
              for i in range(2)]
    for a in agents:
        assert a.wait(timeout=300) == 0, a.text()[-3000:]


# ---- TLS ----

def test_tls_with_client_certificates(etcd, cluster, tmp_path):
    tls = make_tls(tmp_path / "tls")
    e = etcd(1, tls=tls)
    conf = (FAST + f",protocol=https,cacert={tls['ca']},cert={tls['client_cert']},"
            f"key={tls['client_key']}")
    agents = [cluster.agent(str(i), *v3(e.endpoints, 2, conf=conf), env={"LIFETIME": "0.5"})
              for i in range(2)]
    for a in agents:
        assert a.wait() == 0, a.text()[-3000:]
    check_world(rounds(cluster.out)[0], 2, [2, 2])
    # a CA that did not sign the server's certificate: one line naming it
    bad = FAST + (f",join_timeout=2,protocol=https,cacert={tls['other_ca']},"
                  f"cert={tls['client_cert']},key={tls['client_key']}")
    x = cluster.agent("x", *v3(e.endpoints, 2, conf=bad, run_id="tlsbad"))
    assert x.wait(timeout=60) == EXIT_INFRA  # the member refused the TLS handshake
    assert "TLS certificate not accepted" in x.text(), x.text()[-2000:]
    # no client certificate: the member refuses the handshake
    nocert = FAST + f",join_timeout=2,protocol=https,cacert={tls['ca']}"
    y = cluster.agent("y", *v3(e.endpoints, 2, conf=nocert, run_id="tlsbad2"))
    assert y.wait(timeout=60) == EXIT_INFRA
    assert "etcd member 127.0.0.1:" in y.text(), y.text()[-2000:]


def test_prefix_permissions_and_passwords(etcd, cluster):
    """etcd's authentication and RBAC: user 'cddp' may use /allowed/ only.
    Outside it, or with a wrong password, the agent stops with one line
    naming the problem."""
    if not os.access("/usr/bin/etcdctl", os.X_OK):
        pytest.skip("etcdctl is not installed (tools/setup.sh installs etcd-client)")
    e = etcd(1)
    ctl = ["/usr/bin/etcdctl", f"--endpoints={e.members[0].url}"]
    env = dict(os.environ, ETCDCTL_API="3")
    for args in (["user", "add", "root", "--new-user-password=rootpw"],
                 ["role", "add", "cddp"],
                 ["role", "grant-permission", "cddp", "--prefix=true", "readwrite", "/allowed/"],
                 ["user", "add", "cddp", "--new-user-password=s3cret"],
                 ["user", "grant-role", "cddp", "cddp"],
                 ["auth", "enable"]):
        r = subprocess.run(ctl + args, env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (args, r.stderr)
    conf = FAST + ",join_timeout=5,user=cddp"
    pw = {"CDDP_ETCD_PASSWORD": "s3cret"}
    x = cluster.agent("x", *v3(e.endpoints, 1, conf=conf), env=pw)
    assert x.wait(timeout=60) == 1  # refused for the job's own configuration
    bad = [ln for ln in x.text().splitlines() if "A0101" in ln]
    assert len(bad) == 1 and "permission denied" in bad[0], x.text()[-2000:]
    wrong = cluster.agent("w", *v3(e.endpoints, 1, conf=conf + ",password=nope"))
    assert wrong.wait(timeout=60) == 1
    assert "authenticating as 'cddp'" in wrong.text(), wrong.text()[-2000:]
    ok = cluster.agent("ok", *v3(e.endpoints, 1, conf=conf + ",key_prefix=/allowed"),
                     env=dict(pw, LIFETIME="0.3"))
    assert ok.wait(timeout=60) == 0, ok.text()[-2000:]


# ---- three members ----

@pytest.mark.heavy
@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_losing_one_member_restarts_no_worker(etcd, cluster, victim):
    e = etcd(3)
    leader = wait_for(e.leader, timeout=10, what="an etcd leader")
    m = leader if victim == "leader" else next(x for x in e.members if x is not leader)
    # the victim first in the list: the member the agents use
    e.members.remove(m)
    e.members.insert(0, m)
    agents = [cluster.agent(str(i), *v3(e.endpoints, 2), env={"LIFETIME": "12"}) for i in range(2)]
    first = wait_round(cluster.out, 4, timeout=30)
    assert leader.status()["leader"] == leader.status()["header"]["member_id"]
    m.kill()
    # workers run their 12 s and exit 0: the same round all along
    for a in agents:
        assert a.wait(timeout=60) == 0, a.text()[-3000:]
    assert len(rounds(cluster.out)) == 1
    assert {x["TORCHELASTIC_RESTART_COUNT"] for x in first} == {"0"}
    for a in agents:
        assert "will restart worker group" not in a.text()
        assert "A2008" in a.text(), a.text()[-2000:]  # its watch moved on


@pytest.mark.heavy
def test_quorum_lost_then_back_workers_keep_running(etcd, cluster):
    e = etcd(3)
    agents = [cluster.agent(str(i), *v3(e.endpoints, 2, conf=FAST + ",join_timeout=60"),
                          env={"LIFETIME": "25"}) for i in range(2)]
    first = wait_round(cluster.out, 4, timeout=30)
    gone = e.members[1:]
    for m in gone:
        m.kill()
    for a in agents:
        a.wait_log("A2015", timeout=30)  # keep-alive failed; workers keep running
    time.sleep(3)  # longer than the lease TTL
    assert all(alive(int(x["PID"])) for x in first)
    for m in gone:
        m.start()
    for a in agents:
        a.wait_log("A2014", timeout=40)  # answered again
    for a in agents:
        assert a.wait(timeout=60) == 0, a.text()[-3000:]
    assert len(rounds(cluster.out)) == 1


@pytest.mark.heavy
def test_no_quorum_past_join_timeout_is_a_clear_error(etcd, cluster):
    e = etcd(3)
    agents = [cluster.agent(str(i), *v3(e.endpoints, 2, conf=FAST + ",join_timeout=6"))
              for i in range(2)]
    first = wait_round(cluster.out, 4, timeout=30)
    for m in e.members[1:]:
        m.kill()
    for a in agents:
        assert a.wait(timeout=60) == EXIT_INFRA
        assert "no keep-alive answered" in a.text(), a.text()[-2000:]
    wait_for(lambda: not any(alive(int(x["PID"])) for x in first), timeout=10,
             what="the workers to go")
