"""The PEP 517 build backend pyproject.toml names: meson-python builds the
wheel, then repair() makes it install and run on any x86_64 Linux with a
recent enough glibc, as auditwheel would (Debian 12 has no auditwheel).

    python3 -m build --wheel --no-isolation      (or pip wheel . --no-build-isolation)

meson-python (0.12, Debian's python3-mesonpy) configures the tree with
pyproject.toml's [tool.meson-python.args] (-Dwheel=true: the programs and
the cddp Python package are all that is installed; no CUDA; release),
builds it, and packs what meson would install: the programs under
<name>.data/scripts/ (pip puts them in the environment's bin/), the package
under <name>.data/purelib/. Its tag says linux_x86_64, and its programs
still load the libraries of the machine that built them. repair() then:

  - strips the programs and finds, with ldd, every shared library they
    load, and those they open on first use (dlopen: libcurl, libmicrohttpd):
    the libraries dlopen-probe loads (tools/dlopen_probe.c; -Dwheel=true
    installs it for this, and it is left out of the wheel);
  - copies each one that is not glibc's into <name>.data/data/lib/cddp/
    (pip puts it in <prefix>/lib/cddp/, beside the bin/ that holds the
    programs, in a venv, a conda environment, ~/.local or /usr/local alike);
  - sets, with patchelf, a RUNPATH of $ORIGIN/../lib/cddp on the programs
    and $ORIGIN on the copied libraries (a RUNPATH only serves the object
    that has it, so each needs its own);
  - adds the Debian copyright file of every package a library came from to
    the .dist-info (licenses/);
  - tags the wheel py3-none-manylinux_<X>_<Y>_<arch> (PEP 600), X.Y the
    newest glibc symbol version any of its ELF files needs, and writes
    WHEEL and RECORD again.

Needs ldd (glibc), strip and readelf (binutils), patchelf.
"""
import base64
import csv
import hashlib
import io
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import zipfile

import mesonpy
from mesonpy import build_sdist, get_requires_for_build_sdist  # noqa: F401 (PEP 517 hooks)

__all__ = ["build_sdist", "build_wheel", "get_requires_for_build_sdist",
           "get_requires_for_build_wheel", "repair"]

# glibc's own libraries: the system's, never carried (the manylinux rule;
# they must match the dynamic loader that runs the program).
GLIBC = frozenset({
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "linux-vdso.so.1", "libBrokenLocale.so.1",
    "libanl.so.1", "libc.so.6", "libc_malloc_debug.so.0", "libdl.so.2", "libm.so.6",
    "libmvec.so.1", "libnsl.so.1", "libpthread.so.0", "libresolv.so.2", "librt.so.1",
    "libthread_db.so.1", "libutil.so.1",
})
LIBDIR = "lib/cddp"  # under the wheel's .data/data/, i.e. <prefix>/lib/cddp
PROBE = "dlopen-probe"  # links what the programs dlopen; read, not shipped
TOOLS = ("ldd", "strip", "readelf", "patchelf")


class RepairError(RuntimeError):
    pass


def get_requires_for_build_wheel(config_settings=None):
    """Nothing from an index: meson-python, ninja and the tools above come
    from Debian (tools/setup.sh)."""
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise RepairError("cddp wheel: not found: " + ", ".join(missing) +
                          " (apt-get install patchelf binutils)")
    with tempfile.TemporaryDirectory(prefix="cddp-wheel-") as tmp:
        built = mesonpy.build_wheel(tmp, config_settings, metadata_directory)
        return os.path.basename(repair(os.path.join(tmp, built), wheel_directory))


def _run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise RepairError(f"{' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def _is_elf(data):
    return data[:4] == b"\x7fELF"


def _libraries(path):
    """{soname: real path} of every library ldd says path loads, glibc's left
    out. A library ldd cannot find is an error: the wheel would not run."""
    found = {}
    for line in _run("ldd", path).splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(.*?)\s+\(0x[0-9a-f]+\)\s*$", line)
        if m is None:
            if "=>" in line and "not found" in line:
                raise RepairError(f"{path}: {line.strip()}")
            continue
        name, where = m.group(1), m.group(2)
        if name in GLIBC or not where:
            continue
        found[name] = os.path.realpath(where)
    return found


def _glibc_needed(path):
    """The newest GLIBC_x.y version path needs from glibc's libraries, as a
    tuple; (2, 17) when it needs none newer."""
    best = (2, 17)
    current = None
    for line in _run("readelf", "-V", "--wide", path).splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: GLIBC_(\d+)\.(\d+)", line)
        if m and current in GLIBC:
            best = max(best, (int(m.group(1)), int(m.group(2))))
    return best


def _debian_copyright(lib_path):
    """(package, copyright file) of the Debian package that ships lib_path,
    or None (not a Debian system, or a file no package owns)."""
    if shutil.which("dpkg-query") is None:
        return None
    for candidate in (lib_path, "/usr" + lib_path if not lib_path.startswith("/usr/") else
                      lib_path[len("/usr"):]):
        r = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout:
            pkg = r.stdout.split(":", 1)[0].strip()
            doc = f"/usr/share/doc/{pkg}/copyright"
            return (pkg, doc) if os.path.isfile(doc) else None
    return None


def _hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def repair(wheel_path, out_dir):
    """Writes the repaired wheel into out_dir (see the module's comment);
    returns its path."""
    with zipfile.ZipFile(wheel_path) as zin:
        entries = [(i.filename, zin.read(i), i.external_attr >> 16) for i in zin.infolist()
                   if not i.filename.endswith("/")]
    distinfo = next(n.split("/")[0] for n, _, _ in entries
                    if n.endswith(".dist-info/WHEEL") and n.count("/") == 1)
    base = distinfo[: -len(".dist-info")]  # name-version
    data_dir = base + ".data"

    files = {}  # arcname -> (bytes, mode)
    with tempfile.TemporaryDirectory(prefix="cddp-repair-") as tmp:
        programs = []
        probe = None
        for name, data, mode in entries:
            if name.startswith(distinfo + "/") and name.split("/")[-1] in ("RECORD", "WHEEL"):
                continue
            if name.startswith(data_dir + "/scripts/") and _is_elf(data):
                local = os.path.join(tmp, "bin", os.path.basename(name))
                os.makedirs(os.path.dirname(local), exist_ok=True)
                with open(local, "wb") as fh:
                    fh.write(data)
                os.chmod(local, 0o755)
                if os.path.basename(name) == PROBE:
                    probe = local
                else:
                    programs.append((name, local))
                continue
            files[name] = (data, mode or 0o644)
        if not programs:
            raise RepairError(f"{wheel_path}: no programs under {data_dir}/scripts/")
        if probe is None:
            # Without it, the libraries the programs dlopen would be missing
            # and only a status port or the etcd backend would notice.
            raise RepairError(f"{wheel_path}: no {data_dir}/scripts/{PROBE} (meson -Dwheel=true "
                              "installs it)")

        libs = _libraries(probe)
        for _, local in programs:
            _run("strip", local)
            libs.update(_libraries(local))
            _run("patchelf", "--set-rpath", f"$ORIGIN/../{LIBDIR}", local)
        libdir = os.path.join(tmp, "lib")
        os.makedirs(libdir)
        licenses = {}
        for soname, real in sorted(libs.items()):
            local = os.path.join(libdir, soname)
            shutil.copyfile(real, local)
            os.chmod(local, 0o755)
            _run("patchelf", "--set-rpath", "$ORIGIN", local)
            owner = _debian_copyright(real)
            if owner:
                licenses[owner[0]] = owner[1]

        glibc = (2, 17)
        for arc, local in programs:
            glibc = max(glibc, _glibc_needed(local))
            with open(local, "rb") as fh:
                files[arc] = (fh.read(), 0o755)
        for soname in sorted(libs):
            local = os.path.join(libdir, soname)
            glibc = max(glibc, _glibc_needed(local))
            with open(local, "rb") as fh:
                files[f"{data_dir}/data/{LIBDIR}/{soname}"] = (fh.read(), 0o755)
        for pkg, path in sorted(licenses.items()):
            with open(path, "rb") as fh:
                files[f"{distinfo}/licenses/{pkg}.copyright"] = (fh.read(), 0o644)

    arch = platform.machine()
    tag = f"py3-none-manylinux_{glibc[0]}_{glibc[1]}_{arch}"
    files[f"{distinfo}/WHEEL"] = ((
        "Wheel-Version: 1.0\n"
        "Generator: cddp tools/wheel_backend.py (meson-python "
        f"{mesonpy.__version__})\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n").encode(), 0o644)

    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name in sorted(files):
        data = files[name][0]
        writer.writerow([name, _hash(data), len(data)])
    writer.writerow([f"{distinfo}/RECORD", "", ""])

    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, f"{base}-{tag}.whl")
    # dist-info last, as the wheel spec recommends; a fixed date, so the
    # same tree gives the same bytes.
    order = sorted(files, key=lambda n: (n.startswith(distinfo + "/"), n))
    with zipfile.ZipFile(out + ".part", "w", zipfile.ZIP_DEFLATED) as zout:
        for name in order + [f"{distinfo}/RECORD"]:
            if name.endswith("/RECORD"):
                data, mode = record.getvalue().encode(), 0o644
            else:
                data, mode = files[name]
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(info, data)
    os.replace(out + ".part", out)
    return out
