"""What the commands that call the Kubernetes API for a person share (``status``,
``release-gates``, ``certs --in-cluster``): the kubeconfig they use, named when it cannot
be used; no urllib3 warning on the screen; an API error in the same words everywhere.

An error's words: ``HTTP 403 forbidden: <message>``, the message being the one the API
server puts in its ``Status`` body (``metav1.Status``: ``message``), or, when no answer
came, ``the API server did not answer (<why>)``.
"""

from __future__ import annotations

import json
import os
from typing import Any

#: The words for the statuses a user meets most; others are "error".
STATUS_WORDS = {401: "unauthorized", 403: "forbidden", 404: "not found", 409: "conflict"}
#: Where kubectl looks when neither --kubeconfig nor $KUBECONFIG says.
DEFAULT_KUBECONFIG = os.path.join("~", ".kube", "config")


def describe(err: Exception) -> tuple[int | None, str]:
    """The HTTP status of a failed API call (``None``: no answer) and what failed, in
    words."""
    status = getattr(err, "status", None)
    if isinstance(status, int) and status:
        return status, http_error(status, getattr(err, "body", None))
    return None, f"the API server did not answer ({no_answer(err)})"


def no_answer(err: Exception) -> str:
    """Why no answer came, in a user's words, with where it was asked when known
    (urllib3's ``MaxRetryError`` names the pool; its ``reason`` the failure): e.g.
    ``connection refused at http://127.0.0.1:6443``, as kubectl says it, rather than
    urllib3's repr of a connection object."""
    from urllib3 import exceptions as u3

    reason = getattr(err, "reason", None) or err
    pool = getattr(err, "pool", None)
    where = ""
    if pool is not None and getattr(pool, "host", None):
        port = f":{pool.port}" if getattr(pool, "port", None) else ""
        where = f" at {getattr(pool, 'scheme', 'https')}://{pool.host}{port}"
    text = str(reason)
    resolution = getattr(u3, "NameResolutionError", ())
    if isinstance(reason, resolution) or "Name or service not known" in text:
        return f"host not found{where}"
    # before timeouts: urllib3 makes NewConnectionError a ConnectTimeoutError
    if "Connection refused" in text:
        return f"connection refused{where}"
    if isinstance(reason, u3.ConnectTimeoutError):
        return f"timed out connecting{where}"
    if isinstance(reason, (u3.ReadTimeoutError, TimeoutError)):
        return f"timed out waiting for an answer{where}"
    if isinstance(reason, u3.SSLError):
        return f"TLS failed{where}: {short(text)}"
    if isinstance(reason, u3.ProtocolError) or "Connection reset" in text:
        return f"the connection was dropped{where}"
    return short(text) + where


def http_error(status: int, body: Any) -> str:
    message = ""
    if isinstance(body, (bytes, str)):
        try:
            message = str(json.loads(body).get("message") or "")
        except (ValueError, AttributeError):
            message = ""
    words = STATUS_WORDS.get(status, "error")
    return f"HTTP {status} {words}" + (f": {message}" if message else "")


def short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 160 else text[:157] + "..."


def kubeconfig_paths(kubeconfig: str | None) -> list[str]:
    """The kubeconfig files a client reads, as kubectl's rules give them: ``--kubeconfig``,
    else each file of ``$KUBECONFIG``, else ``~/.kube/config``."""
    if kubeconfig:
        return [kubeconfig]
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [os.path.expanduser(DEFAULT_KUBECONFIG)]


def kubeconfig_problem(kubeconfig: str | None, err: Exception) -> str:
    """Why the kubeconfig could not be used, naming its file(s) and where they came from."""
    paths = kubeconfig_paths(kubeconfig)
    origin = (
        "--kubeconfig"
        if kubeconfig
        else "$KUBECONFIG"
        if os.environ.get("KUBECONFIG")
        else "the default"
    )
    missing = [p for p in paths if not os.path.exists(p)]
    named = ", ".join(paths)
    if missing and len(missing) == len(paths):
        return f"kubeconfig {named} ({origin}) does not exist"
    return f"cannot use kubeconfig {named} ({origin}): {short(err)}"


def quiet() -> None:
    """No urllib3 warning on the screen, whatever the transport makes of the user's setup:
    a kubeconfig that skips TLS verification (``insecure-skip-tls-verify``, which kubectl
    honours silently) would otherwise print ``InsecureRequestWarning`` at every request,
    and an SSL library urllib3 does not expect a warning at its import. By the module
    that issues them, so urllib3 need not be imported first."""
    import warnings

    warnings.filterwarnings("ignore", module=r"urllib3(\.|$)")
