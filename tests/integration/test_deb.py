"""The Debian package (tools/mkdeb.sh) installed in a clean Debian 12 root
made by debootstrap (minbase), with its dependencies from the Debian archive
(apt-get install ./cddp.deb inside the root), then smoke-tested there:
`cddprun --nproc_per_node=2 /bin/true`, every program's --version, a
cddp-rdzv that cddpctl reads, the files where Debian wants them; and the
unit file through systemd-analyze verify (outside the root: minbase has no
systemd).

Everything in the root runs inside unshare(1) namespaces of its own (mount
and PID; the smoke test also a network namespace with only loopback), so
the mounts (/proc, /dev, the apt cache) and every process end with it, even
when the test fails. Caches for reruns, under /var/cache/cddp-test (or
CDDP_DEB_CACHE): the debootstrap tarball, the root debootstrap made from it
(a tar: unpacking and configuring the base system takes about a minute of
CPU, the tar a second; test_wheel.py's root starts from it too), apt's
package lists and the .debs apt fetched; the package is built in the
tree's build-deb/ (tools/mkdeb.sh's default).
The mirror is the one this machine's apt uses (/etc/apt/sources.list*).
"""
import os
import pathlib
import re
import shutil
import subprocess
import time

import pytest

from conftest import ROOT
from test_install import verify_unit

CACHE = pathlib.Path(os.environ.get("CDDP_DEB_CACHE", "/var/cache/cddp-test"))
SUITE = "bookworm"


def mirror():
    """The first Debian archive URI apt is configured with (deb822 or one-line)."""
    files = sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*.sources"))
    for f in files:
        text = f.read_text()
        for stanza in text.split("\n\n"):
            if re.search(r"^Suites:.*\bbookworm\b", stanza, re.M) and "debian-security" not in stanza:
                m = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if m:
                    return m.group(1)
    for f in [pathlib.Path("/etc/apt/sources.list"),
              *sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if f.exists():
            for line in f.read_text().splitlines():
                m = re.match(r"deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", line)
                if m and "security" not in m.group(1):
                    return m.group(1)
    return "http://deb.debian.org/debian"


def sh(cmd, timeout, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def in_root(rootfs, script, timeout, net=False):
    """Runs script with sh inside rootfs: a private mount and PID namespace
    (and, with net, a network namespace with loopback up), /proc, /dev and
    the apt cache mounted there; all of it ends when the script does."""
    archives = CACHE / "apt-archives"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    lists = CACHE / "apt-lists"  # apt-get update then only asks whether they changed
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    outer = f"""set -e
mount -t proc proc '{rootfs}/proc'
mount --rbind /dev '{rootfs}/dev'
mount --bind '{archives}' '{rootfs}/var/cache/apt/archives'
mount --bind '{lists}' '{rootfs}/var/lib/apt/lists'
{"ip link set lo up" if net else ""}
exec chroot '{rootfs}' /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 CDDP_TEST_TAG="$CDDP_TEST_TAG" /bin/sh -ec "$0"
"""
    flags = ["--mount", "--pid", "--fork", "--kill-child"] + (["--net"] if net else [])
    return sh(["unshare", *flags, "sh", "-c", outer, script], timeout)


def need_roots(*tools):
    """Skips the test where clean roots cannot be made here."""
    if os.geteuid() != 0:
        pytest.skip("needs root (debootstrap, chroot, mounts)")
    for tool in ("debootstrap", "unshare", "chroot", "ip", *tools):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (tools/setup.sh --test)")
    if sh(["unshare", "--mount", "--pid", "--fork", "true"], 30).returncode != 0:
        pytest.skip("cannot make mount and PID namespaces here (unshare failed)")


def root_tar(layer):
    """The cached tar of a root: debootstrap's ("minbase") or that root with
    more installed (a layer a test saved with save_root)."""
    return CACHE / f"{SUITE}-{layer}-root.tar"


def fresh_root_tar(layer):
    """root_tar(layer) when it is there and newer than the debootstrap
    tarball it was made from, else None."""
    cached, tarball = root_tar(layer), CACHE / f"{SUITE}-minbase.tgz"
    if cached.exists() and tarball.exists() and \
            cached.stat().st_mtime >= tarball.stat().st_mtime:
        return cached
    return None


def save_root(rootfs, layer):
    """Caches rootfs as layer, for minbase_root(tmp_path, layer) next time,
    unless a fresh one is there. Call it when no namespace of in_root() is
    running there (none mounts anything outside its own), with no file of
    the test's own in it."""
    if fresh_root_tar(layer):
        return
    part = CACHE / f".{root_tar(layer).name}.{os.getpid()}"
    r = sh(["tar", "-C", str(rootfs), "--numeric-owner", "--xattrs", "-cf", str(part), "."], 600)
    if r.returncode == 0:
        os.replace(part, root_tar(layer))  # whole, or not there
    else:
        part.unlink(missing_ok=True)


def minbase_root(tmp_path, layer=None):
    """A clean Debian 12 root (debootstrap's minbase) at tmp_path/root, from
    the base system cached as a tarball (made on first use); skips the test
    when the archive cannot be reached. The root debootstrap makes is cached
    too (root_tar), and with layer the one save_root kept under that name,
    when it is newer than the tarball. The caller removes it."""
    url = mirror()
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"{SUITE}-minbase.tgz"
    if not tarball.exists():
        work = tmp_path / "dbs-work"
        part = CACHE / f"{SUITE}-minbase.part.tgz"  # debootstrap wants .tgz
        r = sh(["debootstrap", "--variant=minbase", f"--make-tarball={part}", SUITE, str(work),
                url], 900)
        shutil.rmtree(work, ignore_errors=True)
        if r.returncode != 0:
            pytest.skip(f"debootstrap cannot fetch {SUITE} from {url}: "
                        f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        os.rename(part, tarball)
    rootfs = tmp_path / "root"
    for name in ([layer] if layer else []) + ["minbase"]:
        cached = fresh_root_tar(name)
        if cached:
            rootfs.mkdir()
            r = sh(["tar", "-C", str(rootfs), "--numeric-owner", "--xattrs", "-xpf", str(cached)],
                   600)
            if r.returncode == 0:
                break
            shutil.rmtree(rootfs, ignore_errors=True)
    else:
        r = sh(["debootstrap", "--variant=minbase", f"--unpack-tarball={tarball}", SUITE,
                str(rootfs), url], 900)
        if r.returncode != 0:
            shutil.rmtree(rootfs, ignore_errors=True)
            pytest.skip(f"debootstrap cannot make a root here: "
                        f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        save_root(rootfs, "minbase")
    shutil.copy("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
    return rootfs


@pytest.mark.heavy
def test_deb_in_a_clean_debian_12_root(tmp_path):
    need_roots("dpkg-deb", "dpkg-shlibdeps")
    times = {}
    t0 = time.monotonic()

    # ---- the package, from this tree ----
    r = sh([str(ROOT / "tools" / "mkdeb.sh"), "-B", str(ROOT / "build-deb"), "-o",
            str(tmp_path)], 1200)
    assert r.returncode == 0, r.stdout + r.stderr
    deb = pathlib.Path(r.stdout.strip().splitlines()[-1])
    assert deb.is_file() and re.fullmatch(r"cddp_\d+\.\d+\.\d+(\+git\d{8}\.[0-9a-f]+)?_\w+\.deb",
                                          deb.name), deb
    info = sh(["dpkg-deb", "-f", str(deb), "Package", "Depends"], 60).stdout
    assert "Package: cddp" in info and "libuv1" in info and "libcurl4" in info, info
    # opened on first use (common/dl.h): in Depends through dlopen-probe (mkdeb.sh)
    assert "libmicrohttpd12" in info, info
    times["build the .deb"] = time.monotonic() - t0

    # ---- a clean root (the base system cached as a tarball) ----
    t1 = time.monotonic()
    rootfs = minbase_root(tmp_path)
    try:
        times["debootstrap (minbase, cached tarball)"] = time.monotonic() - t1
        shutil.copy(deb, rootfs / "tmp" / "cddp.deb")
        assert not (rootfs / "usr" / "bin" / "cddprun").exists()

        # ---- apt-get install ./cddp.deb: its dependencies from the archive ----
        t2 = time.monotonic()
        r = in_root(rootfs, "apt-get update -q >/dev/null\n"
                            "apt-get install -y -q --no-install-recommends /tmp/cddp.deb\n"
                            "dpkg-query -W -f='${Status} ${Version}\\n' cddp\n", 900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert re.search(r"^install ok installed \S+$", r.stdout, re.M), r.stdout[-2000:]
        times["apt-get install ./cddp.deb"] = time.monotonic() - t2

        # ---- the smoke test, on loopback only ----
        t3 = time.monotonic()
        smoke = r"""
cddprun --nproc_per_node=2 /bin/true
echo "SMOKE cddprun exit $?"
for p in cddprun cddpctl cddp-rdzv cddp-train; do "$p" --version; done
cddp-rdzv --port=0 --status-port=9400 2>/tmp/rdzv.err &
pid=$!
i=0
until cddpctl health 127.0.0.1:9400 >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 100 ] || { cat /tmp/rdzv.err; exit 3; }; sleep 0.1
done
cddpctl status 127.0.0.1:9400 --json
kill -TERM $pid
wait $pid && echo "SMOKE rdzv exit 0"
ls /usr/share/man/man1/cddprun.1.gz /usr/share/man/man8/cddp-rdzv.8.gz \
   /usr/share/bash-completion/completions/cddprun /lib/systemd/system/cddp-rdzv.service \
   /etc/default/cddp-rdzv /usr/share/cddp/autoprogress/sitecustomize.py
"""
        r = in_root(rootfs, smoke, 300, net=True)
        out = r.stdout
        assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
        assert "SMOKE cddprun exit 0" in out and "SMOKE rdzv exit 0" in out, out
        for p in ("cddprun", "cddpctl", "cddp-rdzv", "cddp-train"):
            assert re.search(rf"^{p} \d+\.\d+\.\d+", out, re.M), (p, out)
        assert '"kind":"rdzv"' in out and '"program":"cddp-rdzv"' in out, out
        times["smoke test in the root"] = time.monotonic() - t3

        # ---- the installed unit, verified (ExecStart pointed into the root) ----
        if shutil.which("systemd-analyze"):
            unit = (rootfs / "lib" / "systemd" / "system" / "cddp-rdzv.service").read_text()
            assert "ExecStart=/usr/bin/cddp-rdzv $CDDP_RDZV_OPTS" in unit
            verify_unit(unit, "/usr/bin", str(rootfs / "usr" / "bin"), tmp_path)
    finally:
        # No mount outlives in_root()'s namespaces, so this removes only files.
        shutil.rmtree(rootfs, ignore_errors=True)
    times["total"] = time.monotonic() - t0
    print("\n" + "\n".join(f"  {k}: {v:.1f} s" for k, v in times.items()))
