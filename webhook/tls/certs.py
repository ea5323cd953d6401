"""Certificates: a CA and a serving certificate made with ``cryptography``, and checks.

The API server only calls webhooks over TLS, and verifies the serving certificate
against the ``caBundle`` of the webhook configuration, so a development setup needs
its own CA. Private keys are written with mode 0600 from the first byte (never
created world-readable and tightened later) and never leave ``certs/``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"

DEFAULT_SERVICE = "retry-policy-webhook"
DEFAULT_NAMESPACE = "retry-policy-webhook"


class CertError(Exception):
    """A certificate that must not be served; the message says what to do."""


@dataclass(frozen=True)
class CertPaths:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / CA_CERT

    @property
    def ca_key(self) -> Path:
        return self.directory / CA_KEY

    @property
    def cert(self) -> Path:
        return self.directory / TLS_CERT

    @property
    def key(self) -> Path:
        return self.directory / TLS_KEY


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use for an in-cluster Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: as strong as RSA-3072 for this purpose, and a far cheaper TLS handshake.
    return ec.generate_private_key(ec.SECP256R1())


def make_ca(
    common_name: str = "retry-policy-webhook CA",
    days: int = 3650,
    start: dt.datetime | None = None,
):
    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = start or _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_serving_cert(
    ca_key,
    ca_cert: x509.Certificate,
    dns_names: list[str],
    ip_addresses: list[str] = (),
    days: float = 365,
    start: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
):
    """A serving certificate; ``not_after`` caps its end (never beyond its CA's)."""
    key = new_key()
    now = start or _now()
    end = now + dt.timedelta(days=days)
    if not_after is not None:
        end = min(end, not_after)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def make_client_cert(ca_key, ca_cert: x509.Certificate, common_name: str, days: int = 365):
    """A client certificate (for the API server's side of ``serve --client-ca``)."""
    key = new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_private(path: Path, data: bytes) -> None:
    """Write a secret atomically with mode 0600 from creation on."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def generate(
    directory: str | Path,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_dns: list[str] = (),
    days: float = 365,
) -> CertPaths:
    """Create a CA (kept if one exists) and a fresh serving certificate signed by it."""
    paths = CertPaths(Path(directory))
    paths.directory.mkdir(parents=True, exist_ok=True)
    if paths.ca_cert.exists() and paths.ca_key.exists():
        ca_cert = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), None)
    else:
        ca_key, ca_cert = make_ca()
        write_private(paths.ca_key, key_pem(ca_key))
        write_public(paths.ca_cert, cert_pem(ca_cert))
    names = ["localhost", *service_dns_names(service, namespace), *extra_dns]
    key, cert = make_serving_cert(ca_key, ca_cert, names, ["127.0.0.1", "::1"], days)
    # Key first, then certificate: a reader that sees the new certificate sees its key.
    write_private(paths.key, key_pem(key))
    write_public(paths.cert, cert_pem(cert))
    return paths


def ensure(directory: str | Path, service: str, namespace: str) -> tuple[CertPaths, bool]:
    """Serving files in ``directory``, generated for development when absent."""
    paths = CertPaths(Path(directory))
    if paths.cert.exists() and paths.key.exists():
        return paths, False
    try:
        return generate(directory, service, namespace), True
    except OSError as err:
        # In a cluster the directory is a read-only Secret mount: say what is missing
        # instead of failing on the generation we only attempt for development.
        raise CertError(
            f"no {TLS_CERT} and {TLS_KEY} in {directory}, and development certificates "
            f"cannot be generated there ({err.strerror or err}); mount the serving "
            "certificate (the chart's Secret) or run: retry-webhook certs --cert-dir "
            f"{directory}"
        ) from None


def check(cert_path: Path, key_path: Path, now: dt.datetime | None = None) -> x509.Certificate:
    """Refuse to serve an unreadable, expired, not-yet-valid or mismatched certificate."""
    try:
        cert_pem_bytes = cert_path.read_bytes()
    except OSError as err:
        raise CertError(f"cannot load certificate {cert_path}: {err}") from None
    try:
        key_pem_bytes = key_path.read_bytes()
    except OSError as err:
        raise CertError(f"cannot load private key {key_path}: {err}") from None
    return check_pem(cert_pem_bytes, key_pem_bytes, str(cert_path), str(key_path), now)


def check_pem(
    cert_data: bytes,
    key_data: bytes,
    cert_name: str = "tls.crt",
    key_name: str = "tls.key",
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """``check`` on bytes already read, so a caller can validate exactly what it loads."""
    now = now or _now()
    try:
        cert = x509.load_pem_x509_certificate(cert_data)
    except ValueError as err:
        raise CertError(f"cannot load certificate {cert_name}: {err}") from None
    try:
        key = serialization.load_pem_private_key(key_data, None)
    except (ValueError, TypeError) as err:
        raise CertError(f"cannot load private key {key_name}: {err}") from None
    if cert.not_valid_after_utc <= now:
        raise CertError(
            f"certificate {cert_name} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
            "renew it (retry-webhook certs) before serving"
        )
    if cert.not_valid_before_utc > now:
        raise CertError(
            f"certificate {cert_name} is not valid before "
            f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (check the clock)"
        )
    if not key_matches(cert, key):
        raise CertError(f"private key {key_name} does not belong to certificate {cert_name}")
    return cert


def key_matches(cert: x509.Certificate, key) -> bool:
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    return cert.public_key().public_bytes(encoding, public) == key.public_key().public_bytes(
        encoding, public
    )


def renew_threshold(lifetime: dt.timedelta, renew_before: dt.timedelta | None) -> dt.timedelta:
    """How long before its end a certificate is renewed.

    Default: at 2/3 of its lifetime, and at the latest 30 days before the end; for
    lifetimes under 60 days, halfway. A freshly issued certificate is therefore never
    due (the threshold is at most half its lifetime), which keeps renewal idempotent.
    """
    if renew_before is not None:
        return renew_before
    return max(lifetime / 3, min(dt.timedelta(days=30), lifetime / 2))


def renewal_due(
    cert: x509.Certificate, now: dt.datetime, renew_before: dt.timedelta | None = None
) -> bool:
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    if cert.not_valid_before_utc > now:
        return True  # issued in the future: a clock problem, reissue rather than wait
    return cert.not_valid_after_utc - now < renew_threshold(lifetime, renew_before)
