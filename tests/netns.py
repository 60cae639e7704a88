"""A cluster of hosts made of network namespaces, for multi-host tests.

    from netns import netns_cluster   # the fixture (noqa: F401 in the test file)

    def test_x(netns_cluster):
        c = netns_cluster(3)          # 3 hosts; pytest.skip where namespaces cannot be made
        h = c.hosts[0]                # .ns, .hostname ("host0"), .addr ("10.77.0.1"), .veth
        p = background(c.prefix(0) + [binary("cddprun"), ...])
        c.partition(1); c.heal(1)     # host 1's link down / up (the others keep theirs)
        c.netem("delay 50ms loss 1%") # on every host's link (skips without sch_netem)
        c.loss(1); c.rate("10mbit")   # nftables random drop, tc tbf: what kernels without
                                      # netem have (c.dropped(i), c.qdisc_stats(i) count)
        c.crash(2)                    # SIGKILL everything in host 2, then cut its link
        c.kill(2)                     # SIGKILL everything in host 2, its link up

What a host is: a network namespace with lo up and one veth, named eth0
inside, whose other end is a port of a bridge the cluster made in the root
namespace; address 10.77.0.(i+1)/16. The bridge has no address of its own,
so nothing in the root namespace can reach the hosts or be reached by them,
and clusters of concurrent tests are separate layer-2 domains (they may use
the same addresses). Commands run through prefix(i): `ip netns exec NS
unshare --uts sh -c 'hostname hostI; exec "$@"'`, so each host has its own
hostname, one that resolves nowhere (as on a fresh cluster without DNS
entries: gloo falls back to loopback unless told an interface). ip netns
exec, unshare and sh exec one another: the pid a test gets is its program's.

Names carry the creating pytest process's pid (hex) and a counter: cn<pid>_<k>h<i>
for namespaces, cnb<pid>_<k> for the bridge, cnv<pid>_<k>.<i> for the root
side of each veth. Teardown (always: the fixture's finally) kills every
process left in the namespaces, deletes them and the veths and
the bridge. A cluster left behind by a run that crashed (its pid is gone) is
removed the same way when the next cluster is made.

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; where `ip netns add`
fails the fixture skips the test with the reason.
"""
import json
import os
import re
import signal
import subprocess
import time

import pytest

PREFIX = "cn"
_NS_RE = re.compile(r"^cn([0-9a-f]+)_([0-9a-f]+)h(\d+)$")
_BR_RE = re.compile(r"^cnb([0-9a-f]+)_([0-9a-f]+)$")
_VETH_RE = re.compile(r"^cnv([0-9a-f]+)_([0-9a-f]+)\.\d+$")
_counter = [0]


def _ip(*args, check=True, timeout=30):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def running(pid):
    """pid exists and is not a zombie (an exited child its parent has not
    reaped yet counts as gone)."""
    if not _pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/status") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except OSError:
        return False


def _ns_pids(ns):
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def _kill_ns(ns):
    """SIGKILL every process in ns, then wait (briefly) until they are gone."""
    for _ in range(3):
        pids = _ns_pids(ns)
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


def _delete(namespaces, bridge, veths=()):
    # The root namespace's ends first: a namespace outlives `ip netns del`
    # while anything still refers to it, and its veth with it.
    for v in veths:
        _ip("link", "del", v, check=False)
    for ns in namespaces:
        _kill_ns(ns)
        _ip("netns", "del", ns, check=False)
    if bridge:
        _ip("link", "del", bridge, check=False)


def clean_stale():
    """Removes clusters whose creating process is gone (a crashed run)."""
    r = _ip("netns", "list", check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NS_RE.match(name)
        if m and not _pid_alive(int(m.group(1), 16)):
            _delete([name], None)
    r = _ip("-o", "link", "show", check=False)
    for line in r.stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        m = _BR_RE.match(name) or _VETH_RE.match(name)
        if m and not _pid_alive(int(m.group(1), 16)):
            _ip("link", "del", name, check=False)


class Host:
    def __init__(self, i, ns, veth):
        self.index = i
        self.ns = ns
        self.veth = veth  # the root namespace's end (a bridge port)
        self.hostname = f"host{i}"
        self.addr = f"10.77.0.{i + 1}"


class Cluster:
    def __init__(self, n):
        clean_stale()
        _counter[0] += 1
        tag = f"{os.getpid():x}_{_counter[0]:x}"
        self.tag = tag
        self.bridge = f"cnb{tag}"
        self.hosts = []
        self._made = []  # namespaces created so far (teardown deletes these)
        self._veths = []  # and the root namespace's ends of their veths
        if n < 1 or n > 200 or len(self.bridge) > 15:
            raise ValueError(f"cannot make {n} hosts named {self.bridge}")
        r = _ip("netns", "add", f"cn{tag}h0", check=False)
        if r.returncode != 0:
            pytest.skip(f"network namespaces cannot be made here: {r.stderr.strip()}")
        self._made.append(f"cn{tag}h0")
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            _ip("link", "set", self.bridge, "up")
            for i in range(n):
                ns = f"cn{tag}h{i}"
                if i > 0:
                    _ip("netns", "add", ns)
                    self._made.append(ns)
                veth = f"cnv{tag}.{i}"
                _ip("link", "add", veth, "type", "veth", "peer", "name", f"cnp{tag}.{i}")
                self._veths.append(veth)
                _ip("link", "set", f"cnp{tag}.{i}", "netns", ns)
                _ip("-n", ns, "link", "set", f"cnp{tag}.{i}", "name", "eth0")
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                h = Host(i, ns, veth)
                _ip("-n", ns, "addr", "add", f"{h.addr}/16", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.hosts.append(h)
            # Every port forwards before a test starts (no STP: at once,
            # but the kernel says so through sysfs).
            self.wait_forwarding()
        except Exception:
            self.close()
            raise

    def prefix(self, i):
        """argv prefix that runs a command on host i, with its own hostname."""
        h = self.hosts[i]
        return ["ip", "netns", "exec", h.ns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', h.hostname]

    def run(self, i, *args, timeout=30):
        """Runs a short command on host i; its CompletedProcess."""
        return subprocess.run(self.prefix(i) + [str(a) for a in args], capture_output=True,
                              text=True, timeout=timeout)

    def wait_forwarding(self, timeout=10):
        deadline = time.monotonic() + timeout
        for h in self.hosts:
            path = f"/sys/class/net/{h.veth}/brport/state"
            while True:
                try:
                    with open(path) as fh:
                        if fh.read().strip() == "3":  # BR_STATE_FORWARDING
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bridge port {h.veth} does not forward")
                time.sleep(0.05)

    def partition(self, i):
        """Host i loses its link: nothing goes in or out (no resets, no refusals)."""
        _ip("link", "set", self.hosts[i].veth, "down")

    def heal(self, i):
        _ip("link", "set", self.hosts[i].veth, "up")

    def netem(self, spec, hosts=None):
        """tc netem on eth0 of the hosts (all by default), e.g. "delay 50ms
        loss 1%": both directions of every link between two hosts pass two
        such queues. Skips the test where the kernel has no sch_netem."""
        for i in hosts if hosts is not None else range(len(self.hosts)):
            r = subprocess.run(["ip", "netns", "exec", self.hosts[i].ns, "tc", "qdisc", "add",
                                "dev", "eth0", "root", "netem", *spec.split()],
                               capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                pytest.skip(f"tc netem is not available here: {r.stderr.strip()}")

    def _in(self, i, *args, stdin=None):
        return subprocess.run(["ip", "netns", "exec", self.hosts[i].ns, *args], input=stdin,
                              capture_output=True, text=True, timeout=30)

    def loss(self, percent, hosts=None):
        """Drops each packet into or out of eth0 with probability percent/100
        (nftables: numgen random, in steps of 0.01%), on the hosts (all by
        default). A packet between two lossy hosts passes the sender's output
        and the receiver's input, so it is lost with about twice that, as
        with netem on both ends. Loopback is untouched. The rules live in the
        host's namespace (table inet cddp_loss) and go with it; clear_loss()
        removes them earlier. Skips the test where nft or the kernel's
        nf_tables is missing."""
        per = round(percent * 100)
        if not 0 <= per <= 10000:
            raise ValueError(f"loss {percent}% is not a percentage")
        rules = ("table inet cddp_loss {\n"
                 "  counter dropped { }\n"
                 "  chain in { type filter hook input priority 0; policy accept;\n"
                 f'    iifname "eth0" numgen random mod 10000 < {per} counter name dropped drop\n'
                 "  }\n"
                 "  chain out { type filter hook output priority 0; policy accept;\n"
                 f'    oifname "eth0" numgen random mod 10000 < {per} counter name dropped drop\n'
                 "  }\n"
                 "}\n")
        for i in hosts if hosts is not None else range(len(self.hosts)):
            self.clear_loss([i])
            try:
                r = self._in(i, "nft", "-f", "-", stdin=rules)
            except FileNotFoundError:
                pytest.skip("nft is not installed (tools/setup.sh installs nftables)")
            if r.returncode != 0:
                if "No such file" in r.stderr or "not found" in r.stderr:
                    pytest.skip(f"nft is not available here: {r.stderr.strip()}")
                raise RuntimeError(f"nft on host {i}: {r.stderr.strip()}")

    def clear_loss(self, hosts=None):
        for i in hosts if hosts is not None else range(len(self.hosts)):
            self._in(i, "nft", "delete", "table", "inet", "cddp_loss")

    def dropped(self, i):
        """Packets host i's loss rules have dropped so far (0 without rules)."""
        r = self._in(i, "nft", "-j", "list", "counter", "inet", "cddp_loss", "dropped")
        if r.returncode != 0:
            return 0
        for item in json.loads(r.stdout).get("nftables", []):
            if "counter" in item:
                return int(item["counter"]["packets"])
        return 0

    def rate(self, rate, hosts=None, burst="64kb", latency="100ms"):
        """A token bucket (tc tbf) on eth0 of the hosts (all by default):
        what they send leaves at `rate` ("10mbit"), bursts of `burst`, and
        a packet that would wait longer than `latency` in the queue is
        dropped. Outgoing only: a link between two limited hosts is limited
        in both directions. clear_rate() removes it."""
        for i in hosts if hosts is not None else range(len(self.hosts)):
            r = self._in(i, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                         "burst", burst, "latency", latency)
            if r.returncode != 0:
                pytest.skip(f"tc tbf is not available here: {r.stderr.strip()}")

    def clear_rate(self, hosts=None):
        for i in hosts if hosts is not None else range(len(self.hosts)):
            self._in(i, "tc", "qdisc", "del", "dev", "eth0", "root")

    def qdisc_stats(self, i):
        """tc's statistics of host i's root qdisc on eth0: bytes, packets,
        drops, overlimits (a dict; empty when there is none)."""
        r = self._in(i, "tc", "-s", "-j", "qdisc", "show", "dev", "eth0", "root")
        try:
            q = json.loads(r.stdout)[0]
        except (ValueError, IndexError):
            return {}
        return {k: q.get(k, 0) for k in ("kind", "bytes", "packets", "drops", "overlimits")}

    def pids(self, i):
        return _ns_pids(self.hosts[i].ns)

    def kill(self, i):
        """Every process in host i SIGKILLed; its link stays up, so the
        kernel closes their connections and the peers see them go at once."""
        _kill_ns(self.hosts[i].ns)

    def crash(self, i):
        """Host i dies: every process in it SIGKILLed, its link cut."""
        self.partition(i)
        _kill_ns(self.hosts[i].ns)

    def close(self):
        _delete(self._made, self.bridge if getattr(self, "_bridge_made", False) else None,
                self._veths)
        self._made = []
        self._veths = []
        self.hosts = []


@pytest.fixture
def netns_cluster():
    """netns_cluster(n) -> Cluster of n hosts; all torn down after the test."""
    made = []

    def make(n):
        c = Cluster(n)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()
