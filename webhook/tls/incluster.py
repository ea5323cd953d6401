"""``retry-webhook certs --in-cluster``: the TLS Secret and the caBundles, kept in step.

The chart runs this as a Helm hook Job before and after every install and upgrade. It
owns one Secret of type ``kubernetes.io/tls``:

- ``tls.crt``, ``tls.key``: the serving certificate (SANs: the Service DNS names) and its key;
- ``ca.crt``: the trust bundle, the current CA first (during a CA rollover the previous
  CA follows it); this is exactly what goes into ``caBundle``;
- ``ca.key``: the current CA's private key. It lives in the same Secret (one object, one
  RBAC rule, written atomically with the certificates); the webhook pods never see it,
  because the Deployment projects only ``tls.crt`` and ``tls.key``.

One run, and why it is safe to repeat:

1. Read the Secret (absent on first install). Keep the CA while it is valid and not due
   for renewal; keep the serving certificate while it is valid, signed by that CA,
   carries every Service name and is not due for renewal. Nothing due: nothing written,
   so a second run changes nothing.
2. Patch ``caBundle`` of every webhook entry in the named configurations whose bundle
   differs (a configuration that does not exist yet, as in ``pre-install``, is skipped;
   the ``post-install`` run fills it in).
3. Write the Secret, last. The kubelet then updates the mounted files and the server
   reloads them (``webhook/serving/certwatch.py``).

A CA rollover (the CA is due) never has a moment where the API server distrusts what a
pod serves: the new bundle is ``new CA + old CA`` and is patched into the configurations
*before* the Secret gets the serving certificate signed by the new CA (with a short
pause so every API server instance has seen it). Pods still serving the old certificate
are trusted through the old CA, pods that reloaded through the new one. The old CA stays
in the bundle for ``CA_OVERLAP`` after the new CA was created (far longer than the
kubelet needs to update mounted Secrets) and is dropped by the first run after that; its
key is gone from the Secret at the rollover, so keeping it a while longer trusts nothing new.

Every write carries the ``resourceVersion`` it was computed from; a 409 (someone else
wrote in between) re-reads and recomputes, a few times.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from webhook.kube import apiclient
from webhook.tls import certs

log = logging.getLogger(__name__)

SECRET_TYPE = "kubernetes.io/tls"  # noqa: S105 - a Secret type, not a password
CA_KEY = "ca.key"
CA_CERT = "ca.crt"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

#: How long the previous CA stays in the bundle after a rollover.
CA_OVERLAP = dt.timedelta(hours=24)
#: Lifetime of a new CA (longer when the serving certificate asks for more).
CA_DAYS = 3650
#: Pause between trusting a new CA and serving a certificate signed by it.
SETTLE_SECONDS = 5.0
#: Attempts of a read-compute-write cycle that keeps meeting 409 Conflict.
MAX_ATTEMPTS = 6

MUTATING = "mutatingwebhookconfiguration"
VALIDATING = "validatingwebhookconfiguration"


class SyncError(Exception):
    """The run cannot succeed as configured; the message says what to change."""


class ApiFailure(SyncError):
    """The API did not answer as needed (unreachable, 5xx, retries exhausted): try again."""


@dataclass(frozen=True)
class WebhookConfigRef:
    """A webhook configuration to patch; ``kind`` None means "whichever kind has it"."""

    name: str
    kind: str | None = None


@dataclass
class Options:
    secret: str
    namespace: str
    service: str
    webhook_configs: list[WebhookConfigRef] = field(default_factory=list)
    days: float = 365
    renew_before_days: float | None = None
    settle_seconds: float = SETTLE_SECONDS


@dataclass
class Material:
    """The four Secret keys, as bytes, and what was decided about them."""

    data: dict[str, bytes]
    ca_rolled: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def bundle(self) -> bytes:
        return self.data[CA_CERT]


# --- deciding what the Secret must hold (pure: no API calls) ----------------------------


def _load_key(data: bytes | None):
    if not data:
        return None
    try:
        return serialization.load_pem_private_key(data, None)
    except (ValueError, TypeError):
        return None


def _load_certs(data: bytes | None) -> list[x509.Certificate]:
    if not data:
        return []
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        return []


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _dns_names(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(sans.get_values_for_type(x509.DNSName))


def _serves(cert: x509.Certificate) -> bool:
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return ExtendedKeyUsageOID.SERVER_AUTH in usage


def _day(when: dt.datetime) -> str:
    return f"{when:%Y-%m-%d}"


def secret_material(
    existing: dict[str, bytes] | None,
    service: str,
    namespace: str,
    days: float,
    renew_before: dt.timedelta | None,
    now: dt.datetime,
) -> Material:
    """What the Secret must hold now, reusing every byte of ``existing`` still good."""
    existing = existing or {}
    out: dict[str, bytes] = {}
    notes: list[str] = []
    names = certs.service_dns_names(service, namespace)

    bundle = _load_certs(existing.get(CA_CERT))
    ca_key = _load_key(existing.get(CA_KEY))
    ca_cert = next(
        (c for c in bundle if ca_key is not None and _is_ca(c) and certs.key_matches(c, ca_key)),
        None,
    )
    # The CA rolls over at 2/3 of its lifetime, or within --renew-before if that is
    # sooner: years early, so many upgrades get the chance to do it.
    ca_ok = (
        ca_cert is not None
        and ca_cert.not_valid_before_utc <= now
        and not certs.renewal_due(ca_cert, now)
        and not (renew_before and ca_cert.not_valid_after_utc - now < renew_before)
    )
    ca_rolled = False
    if ca_ok:
        assert ca_cert is not None
        previous = [
            c
            for c in bundle
            if c is not ca_cert
            and _is_ca(c)
            and c.not_valid_after_utc > now
            and now - ca_cert.not_valid_before_utc < CA_OVERLAP
        ]
        if len(previous) < len(bundle) - 1:
            notes.append("previous CA dropped from the bundle (rollover complete)")
    else:
        ca_days = max(CA_DAYS, days)
        ca_key, ca_cert = certs.make_ca(days=ca_days, start=now)
        previous = [c for c in bundle if _is_ca(c) and c.not_valid_after_utc > now]
        ca_rolled = bool(existing)
        if not existing:
            notes.append(f"new CA (valid until {_day(ca_cert.not_valid_after_utc)})")
        else:
            kept = " (the previous CA stays trusted meanwhile)" if previous else ""
            notes.append(
                f"CA rollover: new CA valid until {_day(ca_cert.not_valid_after_utc)}{kept}"
            )
    new_bundle = [ca_cert, *previous]
    if [c.public_bytes(serialization.Encoding.DER) for c in new_bundle] == [
        c.public_bytes(serialization.Encoding.DER) for c in bundle
    ]:
        out[CA_CERT] = existing[CA_CERT]
    else:
        out[CA_CERT] = b"".join(certs.cert_pem(c) for c in new_bundle)
    out[CA_KEY] = existing[CA_KEY] if ca_ok else certs.key_pem(ca_key)

    reason = _serving_problem(existing, ca_cert if ca_ok else None, names, renew_before, now)
    if reason is None:
        out[TLS_CERT] = existing[TLS_CERT]
        out[TLS_KEY] = existing[TLS_KEY]
    else:
        key, cert = certs.make_serving_cert(
            ca_key, ca_cert, names, days=days, start=now, not_after=ca_cert.not_valid_after_utc
        )
        out[TLS_CERT] = certs.cert_pem(cert)
        out[TLS_KEY] = certs.key_pem(key)
        notes.append(
            f"serving certificate for {names[2]} issued, valid until "
            f"{_day(cert.not_valid_after_utc)} ({reason})"
        )
    return Material(out, ca_rolled, notes)


def _serving_problem(
    existing: dict[str, bytes],
    ca: x509.Certificate | None,
    names: list[str],
    renew_before: dt.timedelta | None,
    now: dt.datetime,
) -> str | None:
    """Why the stored serving certificate cannot stay, or None when it can."""
    if TLS_CERT not in existing:
        return "none yet"
    if ca is None:
        return "new CA"
    try:
        cert = certs.check_pem(existing[TLS_CERT], existing.get(TLS_KEY, b""), now=now)
    except certs.CertError as err:
        return str(err).split(";")[0]
    if not _signed_by(cert, ca):
        return "not signed by the current CA"
    missing = set(names) - _dns_names(cert)
    if missing:
        return "missing DNS names " + ", ".join(sorted(missing))
    if not _serves(cert):
        return "not a server certificate"
    if certs.renewal_due(cert, now, renew_before):
        return f"expires {_day(cert.not_valid_after_utc)}, renewal due"
    return None


# --- talking to the API ---------------------------------------------------------------


def api_clients(kubeconfig: str | None = None) -> tuple[Any, Any]:
    """CoreV1Api and AdmissionregistrationV1Api: the pod's ServiceAccount, else a kubeconfig
    (``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``)."""
    apiclient.quiet()
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (config.ConfigException, OSError, TypeError, ValueError) as err:
        raise SyncError(
            "no Kubernetes API: not running in a pod, and "
            f"{apiclient.kubeconfig_problem(kubeconfig, err)}; set KUBECONFIG or --kubeconfig"
        ) from None
    api = client.ApiClient(configuration)
    return client.CoreV1Api(api), client.AdmissionregistrationV1Api(api)


def _status(err: Exception) -> int | None:
    return getattr(err, "status", None)


def _describe(err: Exception) -> str:
    status = _status(err)
    body = getattr(err, "body", None)
    if status and body:
        try:
            return f"HTTP {status}: {json.loads(body).get('message')}"
        except (ValueError, AttributeError):
            pass
    return f"HTTP {status}" if status else f"{type(err).__name__}: {err}"


def _raw(response: Any) -> dict[str, Any]:
    return json.loads(response.data)


def _decode(secret: dict[str, Any]) -> dict[str, bytes]:
    data = secret.get("data") or {}
    return {k: base64.b64decode(v) for k, v in data.items() if isinstance(v, str)}


def _encode(data: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in data.items()}


class CertSync:
    """One run of the certificate lifecycle against the API (see the module docstring)."""

    def __init__(
        self,
        core: Any,
        admission: Any,
        options: Options,
        now: Callable[[], dt.datetime] = certs._now,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.core = core
        self.admission = admission
        self.options = options
        self.now = now
        self.sleep = sleep
        self.actions: list[str] = []

    def run(self) -> list[str]:
        opts = self.options
        renew_before = None
        if opts.renew_before_days is not None:
            if opts.renew_before_days < 0 or opts.renew_before_days >= opts.days:
                raise SyncError(
                    f"--renew-before {opts.renew_before_days:g} must be >= 0 and below "
                    f"--days {opts.days:g}, or every run would renew the certificate"
                )
            renew_before = dt.timedelta(days=opts.renew_before_days)
        where = f"secret {opts.namespace}/{opts.secret}"
        for _attempt in range(MAX_ATTEMPTS):
            secret = self._read_secret()
            existing = _decode(secret) if secret is not None else None
            if secret is not None:
                self._check_writable(secret)
            material = secret_material(
                existing, opts.service, opts.namespace, opts.days, renew_before, self.now()
            )
            gained = self._patch_bundles(material.bundle)
            changed = existing is None or any(
                existing.get(k) != v for k, v in material.data.items()
            )
            if not changed:
                self.actions.append(f"{where}: unchanged (certificates valid)")
                return self.actions
            if material.ca_rolled and gained and opts.settle_seconds > 0:
                # Let every API server instance see the new bundle before any pod can
                # serve a certificate that only the new CA vouches for.
                self.sleep(opts.settle_seconds)
            try:
                self._write_secret(secret, material.data)
            except _Conflict:
                log.info("%s changed while renewing; reading it again", where)
                continue
            verb = "created" if secret is None else "updated"
            self.actions.append(f"{where}: {verb}: " + "; ".join(material.notes))
            return self.actions
        raise ApiFailure(f"{where}: still conflicting after {MAX_ATTEMPTS} attempts")

    # --- the Secret ---
    def _read_secret(self) -> dict[str, Any] | None:
        opts = self.options
        try:
            return _raw(
                self.core.read_namespaced_secret(
                    opts.secret, opts.namespace, _preload_content=False
                )
            )
        except Exception as err:
            if _status(err) == 404:
                return None
            raise ApiFailure(
                f"cannot read secret {opts.namespace}/{opts.secret}: {_describe(err)}"
            ) from None

    def _check_writable(self, secret: dict[str, Any]) -> None:
        opts = self.options
        kind = secret.get("type") or "Opaque"
        if kind != SECRET_TYPE:
            raise SyncError(
                f"secret {opts.namespace}/{opts.secret} has type {kind}, not {SECRET_TYPE} "
                "(the type cannot be changed): delete it or choose another --secret"
            )
        if secret.get("immutable"):
            raise SyncError(
                f"secret {opts.namespace}/{opts.secret} is immutable and cannot be renewed: "
                "delete it (a new one is created) or choose another --secret"
            )

    def _write_secret(self, secret: dict[str, Any] | None, data: dict[str, bytes]) -> None:
        opts = self.options
        if secret is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": SECRET_TYPE,
                "metadata": {
                    "name": opts.secret,
                    "namespace": opts.namespace,
                    "labels": {"app.kubernetes.io/managed-by": "retry-webhook-certs"},
                },
                "data": _encode(data),
            }
            call = lambda: self.core.create_namespaced_secret(  # noqa: E731
                opts.namespace, body, _preload_content=False
            )
        else:
            body = dict(secret)
            body["data"] = {**(secret.get("data") or {}), **_encode(data)}
            call = lambda: self.core.replace_namespaced_secret(  # noqa: E731
                opts.secret, opts.namespace, body, _preload_content=False
            )
        try:
            call()
        except Exception as err:
            if _status(err) == 409:  # AlreadyExists (create) or Conflict (update)
                raise _Conflict from None
            raise ApiFailure(
                f"cannot write secret {opts.namespace}/{opts.secret}: {_describe(err)}"
            ) from None

    # --- the webhook configurations ---
    def _patch_bundles(self, bundle: bytes) -> bool:
        """Set caBundle everywhere; True when some webhook had to change."""
        encoded = base64.b64encode(bundle).decode()
        changed = False
        for ref in self.options.webhook_configs:
            kinds = [ref.kind] if ref.kind else [MUTATING, VALIDATING]
            found, forbidden = [], []
            for kind in kinds:
                result = self._patch_one(kind, ref.name, encoded)
                if result == "forbidden":
                    forbidden.append(kind)
                elif result != "absent":
                    found.append(kind)
                    changed |= result == "patched"
            if forbidden and not found:
                raise SyncError(
                    f"not allowed to read {' or '.join(forbidden)} {ref.name}: grant get and "
                    "patch on it to this ServiceAccount"
                )
            if not found:
                what = ref.kind or "webhook configuration"
                self.actions.append(f"{what} {ref.name}: not found, skipped (not created yet)")
        return changed

    def _patch_one(self, kind: str, name: str, encoded: str) -> str:
        read, patch = self._calls(kind)
        for _attempt in range(MAX_ATTEMPTS):
            try:
                obj = _raw(read(name, _preload_content=False))
            except Exception as err:
                status = _status(err)
                if status == 404:
                    return "absent"
                if status == 403:
                    return "forbidden"
                raise ApiFailure(f"cannot read {kind} {name}: {_describe(err)}") from None
            hooks = obj.get("webhooks") or []
            ops: list[dict[str, Any]] = [
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
                for i, hook in enumerate(hooks)
                if (hook.get("clientConfig") or {}).get("caBundle") != encoded
            ]
            if not ops:
                self.actions.append(f"{kind} {name}: caBundle up to date")
                return "unchanged"
            # The resourceVersion makes the patch conditional: the indexes above are only
            # right for this version of the object, so any other write in between is a 409.
            version = obj["metadata"]["resourceVersion"]
            ops.insert(0, {"op": "replace", "path": "/metadata/resourceVersion", "value": version})
            try:
                patch(
                    name,
                    ops,
                    _content_type="application/json-patch+json",
                    _preload_content=False,
                )
            except Exception as err:
                status = _status(err)
                if status == 409:
                    continue
                if status == 404:
                    return "absent"
                raise ApiFailure(f"cannot patch {kind} {name}: {_describe(err)}") from None
            self.actions.append(f"{kind} {name}: caBundle set on {len(ops) - 1} webhook(s)")
            return "patched"
        raise ApiFailure(f"{kind} {name}: still conflicting after {MAX_ATTEMPTS} attempts")

    def _calls(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        api = self.admission
        if kind == MUTATING:
            return api.read_mutating_webhook_configuration, api.patch_mutating_webhook_configuration
        return (
            api.read_validating_webhook_configuration,
            api.patch_validating_webhook_configuration,
        )


class _Conflict(Exception):
    pass
