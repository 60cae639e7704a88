"""python -m cddp.run ARGS: cddprun ARGS, the drop-in for
python -m torch.distributed.run (torchrun).

    python -m cddp.run --nproc_per_node=4 train.py --lr 0.1

It replaces this process with the cddprun installed beside this package
(os.execv: same pid, signals and exit status, nothing of Python left
running). As with python -m torch.distributed.run, the workers' Python is
the one running this module (sys.executable) unless PYTHON_EXEC says
otherwise: it sets PYTHON_EXEC for cddprun when it is not set.
"""
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, NoReturn, Optional

__all__ = ["cddprun_path", "main"]


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def cddprun_path() -> "Optional[str]":
    """The cddprun this package was installed with: the one its
    distribution's RECORD lists (wherever pip put scripts: a venv's bin/,
    ~/.local/bin, --prefix, --target), else the scripts directory of this
    interpreter, else cddprun on PATH; None when there is none."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            files = distribution("cddp").files or []
        except PackageNotFoundError:
            files = []
        for f in files:
            if f.name == "cddprun":
                path = os.path.abspath(str(f.locate()))
                if _executable(path):
                    return path
    except ImportError:  # Python < 3.8
        pass
    import sysconfig

    scripts = sysconfig.get_path("scripts")
    if scripts and _executable(os.path.join(scripts, "cddprun")):
        return os.path.join(scripts, "cddprun")
    import shutil

    return shutil.which("cddprun")


def main(argv: "Optional[List[str]]" = None) -> "NoReturn":
    """Execs cddprun with argv (default: this process's arguments)."""
    args = sys.argv[1:] if argv is None else list(argv)
    exe = cddprun_path()
    if exe is None:
        sys.stderr.write("python -m cddp.run: cddprun is not installed with this cddp package "
                         "(pip install --force-reinstall cddp)\n")
        sys.exit(2)
    env = dict(os.environ)
    if not env.get("PYTHON_EXEC") and sys.executable:
        env["PYTHON_EXEC"] = sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(exe, [exe, *args], env)
    except OSError as e:
        sys.stderr.write(f"python -m cddp.run: {exe}: {e.strerror}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
