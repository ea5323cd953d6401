"""Live reloading of mounted files: the cluster defaults file (and, through
``files_stamp``, the serving certificate in ``webhook/serving/certwatch.py``).

Kubernetes updates a mounted ConfigMap or Secret by writing a new timestamped directory
and atomically swapping the ``..data`` symlink; the visible paths are symlinks into it
and never change themselves. ``files_stamp`` therefore stats the *resolved* files
(``os.stat`` follows symlinks): the swap shows as a new inode. A stamp taken before and
after reading proves that what was read is one consistent version; when they differ,
the files were changing under us and the next check tries again.

Each worker runs its own checks (one ``stat`` a second) rather than the supervisor
signalling the workers or starting new ones (as it must for a new certificate): new
workers drop their attempt caches and re-list every Job and failed pod against the API
server; a per-worker check needs no cross-process coordination, and a worker that misses
one check simply catches up on the next. Workers may disagree for at most a check
interval, which is harmless: each request sees one whole config.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from webhook.policy.config import Config, ConfigError, parse_config
from webhook.problems import Problem

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, ...], ...]


def files_stamp(*paths: str | Path) -> Stamp:
    """Identity and version of each file as resolved through symlinks."""
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size))
    return tuple(out)


def _stamp_or_missing(path: Path) -> Stamp:
    try:
        return files_stamp(path)
    except OSError as err:
        return ((-1, err.errno or 0),)


class ConfigReloader:
    """Keeps ``apply(config)`` fed with the config file's latest *valid* version.

    A change is a new stamp (a swap, a rename, a write) or new content (an in-place
    rewrite within one tick of the file system clock keeps every stat field; the file
    is small, so reading it once per check is cheap). An invalid version is refused
    (logged with every problem, reported through ``on_result(False)``) and the last
    good config stays in force; the same bad version is judged only once.
    """

    def __init__(
        self,
        path: str | Path,
        apply: Callable[[Config], None],
        on_result: Callable[[bool], None] = lambda ok: None,
    ):
        self.path = Path(path)
        self.apply = apply
        self.on_result = on_result
        self.last_error: str | None = None
        self._version: tuple[Stamp, bytes | str] | None = None

    def _read(self) -> tuple[Stamp, bytes | str] | None:
        """The file's stamp and content, or None when it changed while being read."""
        stamp = _stamp_or_missing(self.path)
        try:
            data: bytes | str = self.path.read_bytes()
        except OSError as err:
            data = f"cannot read: {err}"
        if _stamp_or_missing(self.path) != stamp:
            return None
        return stamp, data

    def _parse(self, data: bytes | str) -> Config:
        source = str(self.path)
        try:
            if isinstance(data, str):
                raise ValueError(data)
            text = data.decode("utf-8")
        except (ValueError, UnicodeDecodeError) as err:
            raise ConfigError(source, [Problem(source, str(err))]) from None
        return parse_config(text, source)

    def load(self, fallback: Config | None = None) -> Config:
        """The first load. Without ``fallback`` a bad file raises ``ConfigError`` (a server
        must not start on one). With it (a worker started later, e.g. to replace one that
        died, while the file is bad) the fallback is used and the failure reported: a
        worker that cannot boot would leave its slot empty."""
        version = None
        for _ in range(5):
            version = self._read()
            if version is not None:
                break
        if version is None:  # still changing: take what is there now
            version = (_stamp_or_missing(self.path), "changing while read")
        self._version = version
        try:
            return self._parse(version[1])
        except ConfigError as err:
            if fallback is None:
                raise
            self._refused(err, "the config loaded at server start is used")
            return fallback

    def _refused(self, err: ConfigError, consequence: str) -> None:
        self.last_error = str(err)
        log.error(
            f"config reload refused; {consequence}",
            extra={"config": str(self.path), "problems": [str(p) for p in err.problems]},
        )
        self.on_result(False)

    def check(self) -> bool | None:
        """Reload if the file changed: True applied, False refused, None nothing to do."""
        version = self._read()
        if version is None or version == self._version:
            return None
        self._version = version
        try:
            config = self._parse(version[1])
        except ConfigError as err:
            self._refused(err, "the previous config stays in force")
            return False
        self.last_error = None
        self.apply(config)
        log.info(
            "config reloaded",
            extra={
                "config": str(self.path),
                "defaults": len(config.defaults),
                "namespaces": len(config.namespaces),
            },
        )
        self.on_result(True)
        return True
