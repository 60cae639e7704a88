"""cddprun's automatic progress for Python workers (docs/status.md,
"Progress without code changes").

cddprun puts the folder of this file first on a Python worker's PYTHONPATH
(unless --no_auto_progress), so the interpreter imports it at start-up, as
every sitecustomize, before the script runs. It:

  1. takes its folder off PYTHONPATH again (os.environ and sys.path): the
     script, and the programs it starts, see the PYTHONPATH they would
     have seen without cddprun;
  2. imports the sitecustomize that was next on the path (the user's own,
     or the system's), as Python would have, and reports its errors as
     Python's site module does;
  3. when CDDP_PROGRESS_FD names cddprun's pipe, waits until
     torch.optim.optimizer is imported (a finder on sys.meta_path, gone
     once it has seen it) and from then on counts the process's optimizer
     steps: with torch >= 2.0's global register_optimizer_step_post_hook,
     on older torch (1.13) by wrapping each optimizer class's step as its
     first instance is made;
  4. writes one line to the pipe after a step,
     {"step":N,"step_time_s":S,"auto":true}: N counts the process's
     optimizer steps (every optimizer's), S is the mean time a step since
     the previous line. A step that ends less than _LINE_EVERY_S after the
     last line written is only counted; its line comes with the next step
     at least that far on, or at exit, so a fast loop costs a clock read a
     step and the agent at most 50 lines a second. "auto" tells the agent
     the line is this hook's: once the script writes lines of its own, the
     agent ignores these.

Nothing here raises into the script: whatever goes wrong turns the hook off
for the rest of the process, silently (a closed or foreign descriptor, an
agent that is gone, a torch it does not know). The hook itself costs a
clock read a step, and a small bytes format and one write(2) a line
(docs/benchmarks.md, "Automatic progress and stragglers"). No loss is
reported: the only loss an optimizer hook
sees is a closure's return value, and the value backward() was called on is
scaled under AMP's GradScaler and divided under gradient accumulation, and
reading it on a GPU synchronises the device every step.

Standard library only, and only modules the interpreter has loaded by the
time site runs, until torch.optim is imported.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_SELF = sys.modules.get(__name__)


def _unlist_ourselves():
    """This folder off PYTHONPATH and sys.path: cddprun put it first."""
    raw = os.environ.get("PYTHONPATH")
    if raw is not None:
        parts = [p for p in raw.split(os.pathsep) if not (p and os.path.abspath(p) == _HERE)]
        if parts:
            os.environ["PYTHONPATH"] = os.pathsep.join(parts)
        else:
            del os.environ["PYTHONPATH"]
    sys.path[:] = [p for p in sys.path if not (p and os.path.abspath(p) == _HERE)]


def _import_next_sitecustomize():
    """The sitecustomize this one hides, imported as site would have: an
    ImportError of sitecustomize itself is silence, anything else is said
    on stderr in site's words and the start goes on."""
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the next one on sys.path)
    except ImportError as e:
        if e.name != "sitecustomize":
            _site_error(e)
    except Exception as e:
        _site_error(e)
    if "sitecustomize" not in sys.modules and _SELF is not None:
        # The import of this module must end with a module of that name.
        sys.modules["sitecustomize"] = _SELF


def _site_error(e):
    try:
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                             f"{type(e).__name__}: {e}\n")
    except Exception:
        pass


# ---- the hook ----

# Lines at most this often: a step sooner than this after the last line is
# counted, and told with the next line (a hung rank's last few milliseconds
# of steps may so go untold; the watchdog does not need them).
_LINE_EVERY_S = 0.02

_fd = -1  # CDDP_PROGRESS_FD while the hook writes; -1: off
_pid = 0  # the worker's pid: a forked child's steps are not the worker's
_steps = 0  # optimizer steps so far
_told = 0  # the steps the last line told
_told_at = 0.0  # when that line was written (the clock's); 0: none yet
_depth = [0]  # the 1.13 wrappers' nesting (a subclass's step calling its parent's)
_clock = None
_write = os.write


def _channel():
    """CDDP_PROGRESS_FD when it is a pipe (cddprun's), else -1."""
    try:
        fd = int(os.environ.get("CDDP_PROGRESS_FD", ""))
        if fd < 0:
            return -1
        import stat

        return fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else -1
    except (ValueError, OSError):
        return -1


def _tell(now):
    """A line for the steps not told yet, their mean time since the last."""
    global _told, _told_at
    if _told_at:
        mean = (now - _told_at) / (_steps - _told)
        line = b'{"step":%d,"step_time_s":%.6f,"auto":true}\n' % (_steps, mean)
    else:
        line = b'{"step":%d,"auto":true}\n' % _steps
    _told = _steps
    _told_at = now
    _write(_fd, line)


def _stepped():
    """One optimizer step ended: counted, and told when it is time."""
    global _fd, _steps
    try:
        if _fd < 0:
            return
        now = _clock()
        _steps += 1
        if _told_at and now - _told_at < _LINE_EVERY_S:
            return
        if os.getpid() == _pid:
            _tell(now)
    except Exception:
        _fd = -1  # the agent is gone, or the descriptor is not its pipe any more


def _tell_the_rest():
    """At exit: the steps not told yet (the last ones of a fast loop)."""
    global _fd
    try:
        if _fd >= 0 and _steps > _told and os.getpid() == _pid:
            _tell(_clock())
    except Exception:
        _fd = -1


def _post_hook(optimizer, args, kwargs):
    _stepped()


def _count_steps_of(cls):
    """Wraps cls.step (torch < 2.0): each outermost call is one step."""
    import functools

    step = cls.step
    if getattr(step, "_cddp_counted", False):
        return

    @functools.wraps(step)
    def counted_step(*args, **kwargs):
        _depth[0] += 1
        try:
            out = step(*args, **kwargs)
        finally:
            _depth[0] -= 1
        if _depth[0] == 0:
            _stepped()
        return out

    counted_step._cddp_counted = True
    cls.step = counted_step


def _wrap_every_optimizer(optimizer_cls):
    """torch < 2.0 has no global step hook: every optimizer's class gets its
    step wrapped when its first instance is made (after torch's own
    profiling wrapper, which __init__ puts there)."""
    import functools

    init = optimizer_cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            _count_steps_of(type(self))
        except Exception:
            pass

    optimizer_cls.__init__ = __init__


def _arm(module):
    """torch.optim.optimizer is loaded: count its steps from now on."""
    global _clock, _pid, _fd
    try:
        import atexit
        import time

        _clock = time.perf_counter
        _pid = os.getpid()
        atexit.register(_tell_the_rest)
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is not None:
            register(_post_hook)
        else:
            _wrap_every_optimizer(module.Optimizer)
    except Exception:
        _fd = -1


class _WatchForTorchOptim:
    """A finder that finds nothing itself: it sees torch.optim.optimizer
    being imported (by whom and when it may be), lets the path finder load
    it, and arms the hook right after the module ran."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.optim.optimizer":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            import importlib.machinery

            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            loader = spec.loader if spec is not None else None
            run = getattr(loader, "exec_module", None)
            if run is None:
                return None

            def exec_module(module):
                run(module)
                _arm(module)

            loader.exec_module = exec_module
            return spec
        except Exception:
            return None  # the import goes on without the hook


def _start():
    global _fd
    _fd = _channel()
    if _fd < 0:
        return
    loaded = sys.modules.get("torch.optim.optimizer")
    if loaded is not None:  # imported by a sitecustomize before this point
        _arm(loaded)
    else:
        sys.meta_path.insert(0, _WatchForTorchOptim())


try:
    _unlist_ourselves()
    _import_next_sitecustomize()
    _start()
except Exception:
    _fd = -1
