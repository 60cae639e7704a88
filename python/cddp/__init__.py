"""cddp from Python: the pip package's modules.

    python -m cddp.run ARGS              cddprun ARGS (python -m torch.distributed.run's drop-in)
    cddp.progress.report(step=, loss=)   a progress line to cddprun's agent (docs/status.md)
    cddp.status("node:8080")             an agent's or cddp-rdzv's /status, parsed

The programs themselves (cddprun, cddpctl, cddp-rdzv, cddp-train) are in
the environment's bin/. Importing this package imports nothing else: the
progress module is meant for training loops and site hooks, where an
import must cost nothing.
"""
from cddp._version import __version__

# typing costs more to import than this whole package: it is only for type
# checkers (which take TYPE_CHECKING as true), so annotations that name its
# types are strings.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict

__all__ = ["__version__", "status"]


def _status_url(url: str) -> str:
    """HOST:PORT, [V6]:PORT or an http URL -> the URL of its /status."""
    if "://" not in url:
        url = "http://" + url
    scheme, rest = url.split("://", 1)
    if scheme not in ("http", "https"):
        raise ValueError(f"{url}: not an http URL or HOST:PORT")
    host, slash, path = rest.partition("/")
    if not host:
        raise ValueError(f"{url}: no host")
    if not path:
        path = "status"
    return f"{scheme}://{host}/{path}"


def status(url: str, timeout: float = 5.0) -> "Dict[str, Any]":
    """The /status document of a cddprun status port (--status_port) or of
    cddp-rdzv (--status-port), parsed (docs/status.md lists its fields).

    url is ``HOST:PORT``, ``[::1]:PORT``, ``http://HOST:PORT`` or a full
    URL; without a path, /status is asked for. Proxies from the environment
    are not used: the port is on the cluster's own network, as for cddpctl.
    Raises OSError (urllib.error.URLError and HTTPError among them: refused,
    timed out, not 200) or ValueError (a URL it cannot use, a body that is
    not a JSON object)."""
    import json
    import urllib.request

    req = urllib.request.Request(_status_url(url), headers={"Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as resp:
        body = resp.read()
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError(f"{url}: /status is not a JSON object")
    return doc
