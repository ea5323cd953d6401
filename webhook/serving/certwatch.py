"""The serving certificate: read as one consistent, checked version (``ServingPair``),
watched for a new one (``CertificateWatch``), handed to a generation of workers in files
no one else can swap (``StagedPair``), and what a worker knows of it for readiness
(``CertificateStatus``, with the supervisor's ``SharedNote``).

granian's TLS layer reads its files once, when a worker starts. The supervisor watches
``tls.crt``/``tls.key`` (and the ``--client-ca`` bundle) through their symlinks once a
second, as the kubelet swaps a mounted Secret's ``..data`` symlink and deletes the old
directory. A new version is used only once it reads as one consistent, whole, valid pair
(``read_serving_pair``); the workers then get those exact bytes in files of their own
(``StagedPair``: anonymous memory, never a path the kubelet can swap or delete).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import mmap
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from webhook.serving import logs, metrics
from webhook.serving.reload import files_stamp
from webhook.tls import certs

log = logging.getLogger(logs.SERVER_LOGGER)


class _Changing(Exception):
    """The files changed while they were read."""


@dataclass(frozen=True)
class ServingPair:
    """One consistent version of the serving files, checked: the bytes the workers get."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    not_after: dt.datetime
    stamp: Any


def read_serving_pair(cert: Path, key: Path, client_ca: Path | None = None) -> ServingPair:
    """Read the files once, as one version, and check that they can be served.

    The files are stat'ed through their symlinks before and after reading (a kubelet
    ``..data`` swap is a change); when the stamps differ, or a file vanished meanwhile
    (the old directory removed after a swap), ``_Changing`` is raised and the caller
    reads again later. The pair must parse, match and be within its validity
    (``certs.check_pem``), and its key must be one the TLS layer can sign with.
    """
    paths = [cert, key] + ([client_ca] if client_ca else [])
    before = _stamp(paths)
    try:
        data = [path.read_bytes() for path in paths]
        parsed = certs.check_pem(data[0], data[1], str(cert), str(key))
        _check_signable(data[1], str(key))
        if client_ca is not None:
            _check_bundle(data[2], str(client_ca))
    except (OSError, certs.CertError):
        if _stamp(paths) != before:
            raise _Changing from None
        raise
    if _stamp(paths) != before:
        raise _Changing
    return ServingPair(
        data[0], data[1], data[2] if client_ca else None, parsed.not_valid_after_utc, before
    )


def _stamp(paths: list[Path]) -> Any:
    try:
        return files_stamp(*paths)
    except OSError as err:
        return ("missing", err.errno)


def _check_signable(key_pem: bytes, name: str) -> None:
    """Keys rustls (granian's TLS layer) signs with: RSA of 2048 bits or more, ECDSA on
    P-256 or P-384, Ed25519. Checked here so that a key it cannot use is refused like
    a mismatched one, instead of failing every handshake."""
    key = load_pem_private_key(key_pem, None)
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size >= 2048:
        return
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in (
        "secp256r1",
        "secp384r1",
    ):
        return
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return
    raise certs.CertError(
        f"private key {name} is not one the TLS layer can use (RSA of 2048 bits or more, "
        "ECDSA P-256 or P-384, or Ed25519)"
    )


def _check_bundle(pem: bytes, name: str) -> None:
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise certs.CertError(f"client CA bundle {name} holds no certificate: {err}") from None
    if not found:
        raise certs.CertError(f"client CA bundle {name} holds no certificate")


class CertificateWatch:
    """The supervisor's view of the serving files: the pair being served, and a newer
    valid one when the files change (``changed``)."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        client_ca: Path | None = None,
        recorder: metrics.SupervisorMetrics | None = None,
    ):
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.recorder = recorder
        self.last_error: str | None = None
        self._failed: Any = None
        for _ in range(5):  # at start the files may be mid-rotation: a few tries
            try:
                self.serving = read_serving_pair(cert, key, client_ca)
                break
            except _Changing:
                time.sleep(0.05)
        else:
            raise certs.CertError(f"{cert} and {key} keep changing; cannot load them")
        #: The version last judged (served, being rolled out, or refused).
        self._seen = self.serving.stamp

    def changed(self) -> ServingPair | None:
        """A new valid version of the files, once; ``None`` when there is none. A version
        that cannot be served is logged and counted once, and the one being served stays
        (it is tried again on every check: a certificate may become valid)."""
        paths = [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])
        stamp = _stamp(paths)
        if stamp == self._seen:
            return None
        try:
            pair = read_serving_pair(self.cert, self.key, self.client_ca)
        except _Changing:
            return None  # caught mid-write: the next check reads the final files
        except (OSError, certs.CertError, ValueError) as err:
            self.refused(stamp, str(err))
            return None
        self._seen = pair.stamp
        return pair

    def refused(self, stamp: Any, error: str) -> None:
        self.last_error = error
        if stamp == self._failed:
            return
        self._failed = stamp
        if self.recorder is not None:
            self.recorder.certificate_reloaded(False)
        log.warning(
            "certificate reload deferred; the previous certificate is still served",
            extra={"error": error},
        )

    def served(self, pair: ServingPair) -> None:
        """``pair`` is now what every worker serves."""
        self.serving = pair
        self.last_error = None
        if self.recorder is not None:
            self.recorder.certificate_reloaded(True)
        log.info(
            "serving certificate reloaded",
            extra={"cert": str(self.cert), "not_after": pair.not_after.isoformat()},
        )

    def forget(self, pair: ServingPair, error: str) -> None:
        """``pair`` could not be rolled out (its workers failed to start)."""
        self.refused(pair.stamp, error)


class StagedPair:
    """One generation's certificate, key and client CA as files its workers' TLS layer
    reads, at paths that never change: anonymous memory files (``memfd``), opened by the
    workers through ``/proc/self/fd``. The key never touches a disk, and nothing the
    kubelet does to the mounted Secret can change or remove what a worker is about to
    read. (Where memory files do not exist, a private temporary directory.)"""

    NAMES = ("tls.crt", "tls.key", "client-ca.crt")

    def __init__(self, pair: ServingPair):
        self.pair = pair
        self._fds: dict[str, int] = {}
        self._dir: Path | None = None
        contents = dict(zip(self.NAMES, (pair.cert, pair.key, pair.client_ca), strict=True))
        for name, data in contents.items():
            if data is None:
                continue
            if hasattr(os, "memfd_create"):
                fd = os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
                with os.fdopen(os.dup(fd), "wb") as handle:
                    handle.write(data)
                self._fds[name] = fd
            else:
                if self._dir is None:
                    self._dir = Path(tempfile.mkdtemp(prefix="retry-webhook-tls-"))
                certs.write_private(self._dir / name, data)

    def path(self, name: str) -> str | None:
        if name in self._fds:
            return f"/proc/self/fd/{self._fds[name]}"
        if self._dir is not None and (self._dir / name).exists():
            return str(self._dir / name)
        return None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class SharedNote:
    """A few bytes of JSON the supervisor writes and every worker reads (memory shared
    across fork): the latest certificate problem, for ``/readyz``."""

    SIZE = 4096

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self.SIZE)

    def write(self, value: Any) -> None:
        data = json.dumps(value).encode()[: self.SIZE - 4]
        self._map[4 : 4 + len(data)] = data
        self._map[0:4] = struct.pack("I", len(data))

    def read(self) -> Any:
        (size,) = struct.unpack("I", self._map[0:4])
        try:
            return json.loads(self._map[4 : 4 + min(size, self.SIZE - 4)])
        except ValueError:  # read mid-write: nothing to say this time
            return None


@dataclass
class CertificateStatus:
    """What a worker knows of the certificate it serves, for readiness."""

    not_after: dt.datetime
    note: SharedNote | None = None

    def status(self) -> tuple[bool, dict[str, Any]]:
        expired = self.not_after <= certs._now()
        shared = self.note.read() if self.note is not None else None
        return not expired, {
            "notAfter": self.not_after.isoformat(),
            "expired": expired,
            "reloadError": (shared or {}).get("reloadError"),
        }
