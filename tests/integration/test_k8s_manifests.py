"""examples/k8s/: the manifests parse, say what they must (a headless
Service and an Indexed Job whose pods it names, a Kubeflow PyTorchJob with
an elastic policy, a cddp-rdzv Deployment), their ports agree with the
flags they pass (probes, container ports, Prometheus annotations, Service
ports, the rendezvous endpoint), and their command lines run: each is
started for real (cddprun with a sleeping worker, cddp-rdzv as is; only
the ports made free and the node count made one), and every probe path
and the scrape path answer on the live status port.
"""
import os
import pathlib
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

yaml = pytest.importorskip("yaml", reason="python3-yaml is not installed (tools/setup.sh)")

from conftest import binary, free_port

K8S = pathlib.Path(__file__).resolve().parent.parent.parent / "examples" / "k8s"


def docs():
    out = []
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                out.append((f.name, d))
    return out


def find(kind, name=None):
    hits = [d for _, d in docs() if d["kind"] == kind and (name is None or
                                                           d["metadata"]["name"] == name)]
    assert hits, f"no {kind} {name or ''} in examples/k8s"
    return hits


def pod_templates():
    """(kind, name, pod template) for every workload."""
    out = []
    for _, d in docs():
        if d["kind"] in ("Job", "Deployment"):
            out.append((d["kind"], d["metadata"]["name"], d["spec"]["template"]))
        elif d["kind"] == "PyTorchJob":
            for role, spec in d["spec"]["pytorchReplicaSpecs"].items():
                out.append((d["kind"], d["metadata"]["name"], spec["template"]))
    return out


def flag(args, name):
    """The value of --name=V (either spelling) in args, or None."""
    spellings = {name, name.replace("_", "-")}
    for a in args:
        k, eq, v = a.partition("=")
        if eq and k in spellings:
            return v
    return None


def status_port_of(c):
    args = c.get("args", [])
    if c["command"][0] == "cddprun":
        return int(flag(args, "--status_port"))
    return int(flag(args, "--status-port"))


def test_manifests_parse_and_say_what_they_must():
    kinds = sorted({d["kind"] for _, d in docs()})
    assert kinds == ["Deployment", "Job", "PyTorchJob", "Service"], kinds
    job = find("Job")[0]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"]
    sub = job["spec"]["template"]["spec"]["subdomain"]
    svc = find("Service", sub)[0]
    assert svc["spec"]["clusterIP"] == "None"  # headless
    assert svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    # the endpoint is pod 0 under that Service, and its port is the Service's rdzv port
    c = job["spec"]["template"]["spec"]["containers"][0]
    ep = flag(c["args"], "--rdzv_endpoint")
    host, _, port = ep.rpartition(":")
    assert host == f"{job['metadata']['name']}-0.{sub}", ep
    svc_ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert int(port) == svc_ports["rdzv"]
    assert int(flag(c["args"], "--nnodes")) == job["spec"]["completions"]
    assert status_port_of(c) == svc_ports["status"]
    pj = find("PyTorchJob")[0]
    ep = pj["spec"]["elasticPolicy"]
    assert 1 <= ep["minReplicas"] <= ep["maxReplicas"] and ep["rdzvBackend"] == "c10d"
    assert pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "name"] == "pytorch"
    dep = find("Deployment", "cddp-rdzv")[0]
    rsvc = find("Service", "cddp-rdzv")[0]
    assert rsvc["spec"]["selector"] == dep["spec"]["template"]["metadata"]["labels"]
    rc = dep["spec"]["template"]["spec"]["containers"][0]
    assert rc["command"] == ["cddp-rdzv"]
    assert int(flag(rc["args"], "--port")) == {p["name"]: p["port"]
                                               for p in rsvc["spec"]["ports"]}["rdzv"]


def exit_codes():
    """{name: value} of cddprun's exit codes, from common/exitcodes.h."""
    text = (K8S.parent.parent / "common" / "exitcodes.h").read_text()
    return {m[0]: int(m[1]) for m in re.findall(r"CDDP_EXIT_(\w+) = (\d+),", text)}


def test_job_pod_failure_policy(tmp_path):
    """The Indexed Job retries a pod only where another try can help: it
    fails the job on a usage error and on no progress, ignores a pod the
    cluster disrupted (preemption, a drain), and counts the rest against a
    backoffLimit that allows retries. The codes are cddprun's own, and a
    usage error of its command line does exit with one that ends the job."""
    job = find("Job")[0]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert spec["backoffLimit"] > 0
    rules = spec["podFailurePolicy"]["rules"]
    codes = exit_codes()
    fail = [r for r in rules if r["action"] == "FailJob"]
    assert len(fail) == 1 and fail[0]["onExitCodes"]["operator"] == "In"
    assert fail[0]["onExitCodes"]["containerName"] == pod["containers"][0]["name"]
    assert sorted(fail[0]["onExitCodes"]["values"]) == sorted([codes["USAGE"], codes["NO_PROGRESS"]])
    for kept in ("OK", "FAILURE", "HUNG", "INFRA"):  # retried (or success): never FailJob
        assert codes[kept] not in fail[0]["onExitCodes"]["values"]
    assert 128 not in fail[0]["onExitCodes"]["values"]
    ignore = [r for r in rules if r["action"] == "Ignore"]
    assert ignore and ignore[0]["onPodConditions"] == [{"type": "DisruptionTarget"}]
    assert {r["action"] for r in rules} <= {"FailJob", "Ignore", "Count"}
    # the container's own command line with one bad flag: the FailJob code
    c = pod["containers"][0]
    args = list(c["args"])
    at = args.index("cddp-train")  # the bad flag last among cddprun's, so it wins
    env = dict(os.environ, PATH=f"{os.path.dirname(binary('cddp-train'))}:{os.environ['PATH']}")
    r = subprocess.run([binary("cddprun"), *args[:at], "--max_restarts=-1", *args[at:]],
                       capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode in fail[0]["onExitCodes"]["values"], r.stderr
    assert r.returncode == codes["USAGE"] and "--max_restarts" in r.stderr, r.stderr


@pytest.mark.parametrize("kind,name,tmpl", pod_templates(), ids=lambda v: v if isinstance(v, str)
                         else None)
def test_ports_match_flags(kind, name, tmpl):
    ann = tmpl["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    for c in tmpl["spec"]["containers"]:
        port = status_port_of(c)
        addr = flag(c["args"], "--status_addr" if c["command"][0] == "cddprun" else "--status-addr")
        assert addr == "0.0.0.0", "probes and Prometheus come from outside the pod"
        assert int(ann["prometheus.io/port"]) == port
        assert ann["prometheus.io/path"] == "/metrics"
        cports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert cports["status"] == port
        assert cports["rdzv"] == 29400
        assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": port}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_ready(port, proc, deadline=60):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if get(port, "/readyz")[0] == 200:
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    pytest.fail(f"/readyz on {port} never passed")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.communicate()


@pytest.mark.parametrize("kind,name,tmpl", pod_templates(), ids=lambda v: v if isinstance(v, str)
                         else None)
def test_command_lines_run_and_probes_answer(tmp_path, kind, name, tmpl):
    c = tmpl["spec"]["containers"][0]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env["OMP_NUM_THREADS"] = "1"
    args = list(c["args"])
    if c["command"][0] == "cddprun":
        worker = tmp_path / "worker"
        worker.write_text("#!/bin/sh\nexec sleep 60\n")
        worker.chmod(0o755)
        first = next(i for i, a in enumerate(args) if not a.startswith("-"))
        opts = []
        for a in args[:first]:
            k = a.partition("=")[0]
            if k in ("--status_port", "--status-port"):
                a = f"--status_port={port}"
            elif k in ("--rdzv_endpoint", "--rdzv-endpoint"):
                a = f"--rdzv_endpoint=127.0.0.1:{free_port()}"
            elif k == "--nnodes":
                a = "--nnodes=1"
            elif k in ("--nproc_per_node", "--nproc-per-node"):
                a = "--nproc_per_node=1"
            opts.append(a)
        if kind == "PyTorchJob":
            # What the training operator sets (elastic.go), for one local node.
            env.update({"PET_NNODES": "1:1", "PET_RDZV_BACKEND": "c10d",
                        "PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "PET_RDZV_ID": name,
                        "PET_MAX_RESTARTS": "3", "PET_N_PROC_PER_NODE": "1"})
        cmd = [binary("cddprun"), *opts, str(worker)]
    else:
        opts = []
        for a in args:
            k = a.partition("=")[0]
            if k == "--status-port":
                a = f"--status-port={port}"
            elif k == "--port":
                a = "--port=0"
            opts.append(a)
        cmd = [binary(c["command"][0]), *opts]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        wait_ready(port, proc)
        for probe in ("livenessProbe", "readinessProbe"):
            code, body = get(port, c[probe]["httpGet"]["path"])
            assert code == 200, (probe, code, body)
        code, body = get(port, tmpl["metadata"]["annotations"]["prometheus.io/path"])
        assert code == 200 and "cddp_" in body
    finally:
        out, err = stop(proc)
    if any("'" in a for a in args):
        assert "L2001" in err and "removed the quotes" in err, err
