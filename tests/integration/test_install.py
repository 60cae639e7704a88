"""`meson install --destdir` of the build under test: the layout (programs,
man pages, docs, bash completion, cddp-rdzv's systemd unit, each where its
directory option says), the man pages through man -l with groff's warnings
on, the completion sourced in a real bash, and the unit through
systemd-analyze verify."""
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import BUILD, ROOT, run

PROGRAMS = ["cddprun", "cddpctl", "cddp-train", "cddp-rdzv"]
MAN_PAGES = {"cddprun": "1", "cddpctl": "1", "cddp-train": "1", "cddp-rdzv": "8"}


def options():
    with open(BUILD / "meson-info" / "intro-buildoptions.json") as fh:
        return {o["name"]: o["value"] for o in json.load(fh)}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(destdir, the install's prefix inside it, the build's options)."""
    dest = tmp_path_factory.mktemp("destdir")
    r = subprocess.run(["meson", "install", "-C", str(BUILD), "--destdir", str(dest),
                        "--no-rebuild", "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    opts = options()
    return dest, pathlib.Path(str(dest) + opts["prefix"]), opts


def under(prefix, opt_value):
    """A meson directory option (relative to the prefix, or absolute) in the destdir."""
    p = pathlib.Path(opt_value)
    return p if not p.is_absolute() else pathlib.Path(str(prefix).rsplit(str(p), 1)[0] + str(p))


def test_layout(installed):
    dest, prefix, opts = installed
    bindir = prefix / opts["bindir"]
    for prog in PROGRAMS:
        exe = bindir / prog
        assert exe.is_file() and os.access(exe, os.X_OK), exe
        r = run([str(exe), "--version"])
        assert r.returncode == 0 and r.stdout.split()[0] == prog, (prog, r.stdout, r.stderr)
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    # Nothing but these: the programs, man pages, docs (and what else goes in the
    # doc directory), completion, the unit, the automatic progress' bootstrap.
    allowed = re.compile(r".*/(bin/(cddprun|cddpctl|cddp-train|cddp-rdzv)"
                         r"|share/man/man[18]/cddp[-a-z]*\.[18]"
                         r"|share/doc/cddp/.+"
                         r"|share/bash-completion/completions/(cddprun|cddpctl|cddp-train|cddp-rdzv)"
                         r"|share/cddp/autoprogress/sitecustomize\.py"
                         r"|lib/systemd/system/cddp-rdzv\.service)$")
    assert [f for f in found if not allowed.match("/" + f)] == []
    doc = prefix / opts["datadir"] / "doc" / "cddp"
    assert (doc / "README.md").is_file() and (doc / "status.md").is_file()
    comp = prefix / opts["datadir"] / "bash-completion" / "completions"
    assert sorted(p.name for p in comp.iterdir()) == sorted(PROGRAMS)
    unit = prefix / "lib" / "systemd" / "system" / "cddp-rdzv.service"
    if opts["prefix"] == "/usr":
        unit = next(dest.rglob("cddp-rdzv.service"))
    text = unit.read_text()
    assert f"ExecStart={opts['prefix']}/{opts['bindir']}/cddp-rdzv $CDDP_RDZV_OPTS" in text


def test_auto_progress_bootstrap_found_beside_cddprun(installed, tmp_path):
    """The installed cddprun finds its bootstrap folder (as the .deb puts
    it: <datadir>/cddp/autoprogress, beside <bindir>) and a Python worker's
    optimizer steps come through it."""
    dest, prefix, opts = installed
    boot = prefix / opts["datadir"] / "cddp" / "autoprogress"
    assert (boot / "sitecustomize.py").read_bytes() == \
        (ROOT / "python" / "autoprogress" / "sitecustomize.py").read_bytes()
    script = tmp_path / "steps.py"
    script.write_text("import torch\n"
                      "opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)\n"
                      "for i in range(3):\n    opt.step()\n")
    r = run([prefix / opts["bindir"] / "cddprun", "--nproc_per_node=1", script], timeout=120,
            env=dict(os.environ, LOGLEVEL="INFO"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"L0005: automatic progress is on: " in r.stderr, r.stderr[-3000:]
    assert f"({boot.resolve()} first on its PYTHONPATH" in r.stderr, r.stderr[-3000:]


def test_man_pages(installed):
    dest, prefix, opts = installed
    if shutil.which("scdoc") is None:
        pytest.skip("scdoc is not installed: the man pages are not built (tools/setup.sh)")
    if shutil.which("man") is None:
        pytest.skip("man (man-db) is not installed")
    mandir = prefix / opts["mandir"]
    for page, section in MAN_PAGES.items():
        path = mandir / f"man{section}" / f"{page}.{section}"
        assert path.is_file(), path
        r = subprocess.run(["man", "--warnings", "-l", str(path)], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, MANWIDTH="80",
                                                           MAN_KEEP_FORMATTING="0"))
        assert r.returncode == 0, r.stderr
        assert r.stderr == "", f"{page}({section}): groff warnings:\n{r.stderr}"
        out = re.sub(".\x08", "", r.stdout)  # grotty's overstrike bold and underline
        assert out.startswith(f"{page}({section})"), out[:200]
        for head in ("NAME", "SYNOPSIS", "DESCRIPTION", "SEE ALSO"):
            assert re.search(rf"^{head}$", out, re.M), (page, head)
        if page != "cddp-train":
            assert re.search(r"^EXIT STATUS$", out, re.M), page
    # Every flag a program's --help names is in its man page.
    for prog, section in MAN_PAGES.items():
        help_text = run([str(prefix / opts["bindir"] / prog), "--help"]).stdout
        page = subprocess.run(["man", "-l", str(mandir / f"man{section}" / f"{prog}.{section}")],
                              capture_output=True, text=True,
                              env=dict(os.environ, MANWIDTH="250")).stdout
        page = re.sub(".\x08", "", page)
        flags = set(re.findall(r"--[a-z][a-z0-9-]+", help_text))
        assert flags and sorted(f for f in flags if f not in page) == [], prog


def complete(bin_dir, script, words):
    """COMPREPLY after sourcing the completion script in bash with the line so far."""
    line = " ".join(f"'{w}'" for w in words)
    prog = f"""
set -u
source '{script}'
COMP_WORDS=({line})
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
_cddp
printf '%s\\n' "${{COMPREPLY[@]}}"
complete -p {words[0]}
"""
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", prog], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1].startswith("complete ") and "-F _cddp" in lines[-1], lines[-1]
    return [x for x in lines[:-1] if x]


def test_bash_completion(installed):
    dest, prefix, opts = installed
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    bindir = prefix / opts["bindir"]
    script = prefix / opts["datadir"] / "bash-completion" / "completions" / "cddprun"
    assert complete(bindir, script, ["cddprun", "--nproc_p"]) == ["--nproc_per_node"]
    assert complete(bindir, script, ["cddprun", "--nproc-p"]) == ["--nproc-per-node"]
    assert complete(bindir, script, ["cddprun", "--status-l"]) == ["--status-linger"]
    # cddprun ... cddp-train: the trainer's flags.
    assert complete(bindir, script, ["cddprun", "--nproc_per_node=2", "cddp-train", "--sync"]) \
        == ["--sync-bn"]
    assert complete(bindir, script, ["cddpctl", ""]) == ["health", "job", "stacks", "status"]
    assert complete(bindir, script, ["cddpctl", "status", "--wa"]) == ["--watch"]
    assert complete(bindir, script, ["cddp-rdzv", "--token"]) == ["--token-file", "--token_file"]
    assert complete(bindir, script, ["cddp-train", "--ar"]) == ["--arch"]
    # A flag the program does not have is not offered.
    assert complete(bindir, script, ["cddpctl", "--nproc"]) == []


def test_systemd_unit_verifies(installed, tmp_path):
    dest, prefix, opts = installed
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian systemd)")
    unit = next(dest.rglob("cddp-rdzv.service"))
    text = unit.read_text()
    for setting in ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict",
                    "ProtectHome=yes", "PrivateTmp=yes", "CapabilityBoundingSet=\n",
                    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX"):
        assert setting in text, setting
    verify_unit(text, f"{opts['prefix']}/{opts['bindir']}", str(prefix / opts["bindir"]),
                tmp_path)


def verify_unit(text, bindir, real_bindir, tmp_path):
    """systemd-analyze verify on the unit, with ExecStart pointing where the
    program really is (it checks that it exists and is executable); any
    message (an unknown key, a bad value) fails."""
    fixed = text.replace(f"ExecStart={bindir}/", f"ExecStart={real_bindir}/")
    assert fixed != text or bindir == real_bindir
    copy = tmp_path / "cddp-rdzv.service"
    copy.write_text(fixed)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0 and ("Failed to initialize manager" in r.stderr
                              or "Failed to setup working directory" in r.stderr):
        pytest.skip(f"systemd-analyze cannot run in this container: {r.stderr.strip()}")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    # The checker can fail: a misspelt key is reported.
    copy.write_text(fixed.replace("ProtectSystem=strict", "ProtectSystm=strict"))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True,
                       text=True, timeout=120)
    assert "Unknown key 'ProtectSystm'" in r.stderr
