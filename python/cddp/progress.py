"""cddp.progress: a worker's training progress, written to cddprun's agent.

    from cddp.progress import report
    for step, (x, y) in enumerate(loader):
        ...
        report(step=step, loss=loss.item(), epoch=epoch, samples_per_s=rate)

Each call writes one line to the worker progress channel (docs/status.md,
"The worker progress channel"): one JSON object and a newline, in one
write(2) to the descriptor named by CDDP_PROGRESS_FD, which cddprun gives
every worker. The agent shows the values on /status, /metrics and
`cddpctl status`, and its progress watchdog (--watchdog_timeout) sees the
worker is alive. Outside cddprun (plain python, torchrun), where
CDDP_PROGRESS_FD is not set, report() does nothing.

report() never raises into the training loop (KeyboardInterrupt aside): a
value the agent would drop, a descriptor that is closed or not the agent's
pipe, an agent that is gone: the line is not written, and the first such
problem in the process is told once on stderr. Known fields follow the
channel's rules: step and epoch integers >= 0, loss a number (NaN and
infinities included), samples_per_s a finite number >= 0; other keyword
arguments are sent as they are (the agent ignores them today). A 0-d
tensor or a NumPy scalar is taken by its .item(). None means "not this
time": the field is left out.

Importing this module costs two standard modules already loaded by every
interpreter (os, sys); json is imported on the first report() under
cddprun. It keeps no state but the descriptor, so it can be called from
several threads and from the processes a worker forks (a DataLoader's).
"""
import os
import sys

# typing is for type checkers only (see cddp/__init__.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

__all__ = ["report"]

# The channel's limit (proto/progress.h PROGRESS_LINE_MAX): the agent drops a
# longer line, and a write up to PIPE_BUF never interleaves with another.
LINE_MAX = 4096

_UNSET = -2
_fd = _UNSET  # the descriptor; -1: no channel (not under cddprun, or unusable)
_warned = False


def _warn_once(what: str) -> None:
    """The one warning of this process (stderr: warnings.warn could be
    turned into an exception by -W error, and that would reach the caller)."""
    global _warned
    if _warned:
        return
    _warned = True
    try:
        sys.stderr.write(f"cddp.progress: {what}; progress lines that cannot be written are "
                         "dropped without a further word\n")
        sys.stderr.flush()
    except Exception:
        pass


def _channel() -> int:
    global _fd
    if _fd != _UNSET:
        return _fd
    _fd = -1
    raw = os.environ.get("CDDP_PROGRESS_FD", "")
    if raw == "":
        return -1
    try:
        fd = int(raw)
    except ValueError:
        _warn_once(f"CDDP_PROGRESS_FD={raw!r} is not a descriptor number")
        return -1
    if fd < 0:
        return -1
    import stat

    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        _warn_once(f"CDDP_PROGRESS_FD={fd} cannot be used ({e.strerror})")
        return -1
    if not stat.S_ISFIFO(mode):
        # Something else took the number (the script closed the pipe and
        # opened a file): writing there would corrupt that file.
        _warn_once(f"CDDP_PROGRESS_FD={fd} is not the agent's pipe any more")
        return -1
    _fd = fd
    return fd


def _plain(value: "Any") -> "Any":
    """A tensor's or NumPy scalar's Python value; anything else as it is."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return value


def _number(value: "Any") -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(values: "Dict[str, Any]") -> "Optional[str]":
    """Why the agent would drop this line (proto/progress.c's rules), or None."""
    import math

    for key in ("step", "epoch"):
        v = values.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            return f"{key}={v!r} is not an integer >= 0"
    v = values.get("loss")
    if v is not None and not _number(v):
        return f"loss={v!r} is not a number"
    v = values.get("samples_per_s")
    if v is not None and (not _number(v) or not math.isfinite(v) or v < 0):
        return f"samples_per_s={v!r} is not a finite number >= 0"
    return None


def _line(values: "Dict[str, Any]") -> "Optional[bytes]":
    import json

    problem = _check(values)
    if problem is not None:
        _warn_once(problem)
        return None
    try:
        # Python's NaN and Infinity are what the agent accepts for a loss.
        text = json.dumps(values, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError) as e:
        _warn_once(f"a value cannot be sent as JSON ({e})")
        return None
    line = (text + "\n").encode()
    if len(line) > LINE_MAX + 1:
        _warn_once(f"a progress line of {len(line) - 1} bytes is over the agent's limit of "
                   f"{LINE_MAX}")
        return None
    return line


def report(step: "Optional[int]" = None, loss: "Optional[float]" = None, **extra: "Any") -> None:
    """Writes one progress line (step, loss, and any other fields: epoch,
    samples_per_s, ...) to cddprun's agent; does nothing outside cddprun.
    Never raises (but KeyboardInterrupt and SystemExit); see the module's
    documentation."""
    global _fd
    try:
        fd = _channel()
        if fd < 0:
            return
        values: "Dict[str, Any]" = {}
        if step is not None:
            values["step"] = _plain(step)
        if loss is not None:
            values["loss"] = _plain(loss)
        for key, v in extra.items():
            if v is not None:
                values[key] = _plain(v)
        if not values:
            return
        line = _line(values)
        if line is None:
            return
        try:
            os.write(fd, line)
        except OSError as e:
            # The agent is gone (EPIPE: Python ignores SIGPIPE) or the
            # descriptor was closed: nothing later can get through either.
            _fd = -1
            _warn_once(f"writing to CDDP_PROGRESS_FD={fd} failed ({e.strerror})")
    except Exception as e:  # never into the training loop
        _warn_once(f"report() failed ({type(e).__name__}: {e})")
