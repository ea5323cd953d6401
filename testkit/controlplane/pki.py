"""The control plane's certificates and kubeconfigs, made with ``cryptography``.

One CA signs the API server's serving certificate and every client certificate; the API
server trusts it for clients (``--client-ca-file``), as kubeadm's single cluster CA does. A
client certificate's CN is the user and each O a group (the API server's x509
authenticator, ``k8s.io/apiserver/pkg/authentication/request/x509``), so the controller
manager and the scheduler authenticate as the users that the RBAC bootstrap policy binds
their roles to (``system:kube-controller-manager``, ``system:kube-scheduler``). The service
account signing key signs the ServiceAccount tokens that our server uses, so the API server
enforces the chart's RBAC and ValidatingAdmissionPolicy on it.

Every file lives under the cluster's own directory (``.cluster/``, ignored by git): nothing
here is ever committed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.tls.certs import (
    cert_pem,
    key_pem,
    make_ca,
    make_serving_cert,
    new_key,
    write_private,
    write_public,
)

#: The names and addresses the API server answers to: loopback, and the in-cluster names of
#: the ``kubernetes`` Service (its ClusterIP is the first of ``SERVICE_CIDR``).
SERVICE_CIDR = "10.96.0.0/16"
APISERVER_NAMES = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]
APISERVER_IPS = ["127.0.0.1", "10.96.0.1"]

#: Who each component is: (user, groups). The kubelet and the admin are in system:masters:
#: the played kubelet is one process for every fake Node, which the Node authorizer (one
#: identity per node) could not admit.
IDENTITIES = {
    "admin": ("kubernetes-admin", ["system:masters"]),
    "controller-manager": ("system:kube-controller-manager", []),
    "scheduler": ("system:kube-scheduler", []),
    "kubelet": ("kcp-kubelet", ["system:masters"]),
    "jobset": ("jobset-controller", ["system:masters"]),
}


def make_client_cert(ca_key, ca_cert: x509.Certificate, user: str, groups: list[str]):
    key = new_key()
    now = dt.datetime.now(dt.timezone.utc)
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


@dataclass(frozen=True)
class PKI:
    """Where the files are, under ``directory``."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, who: str) -> Path:
        return self.directory / f"{who}.crt"

    def client_key(self, who: str) -> Path:
        return self.directory / f"{who}.key"

    def kubeconfig(self, who: str) -> Path:
        return self.directory / f"{who}.kubeconfig"


def create(directory: Path, server: str) -> PKI:
    """Every certificate, key and kubeconfig the control plane needs, pointing at
    ``server`` (``https://127.0.0.1:<port>``). Made fresh each time: a cluster's data lives
    and dies with its certificates."""
    pki = PKI(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca("kcp cluster CA")
    write_private(pki.ca_key, key_pem(ca_key))
    write_public(pki.ca, cert_pem(ca_cert))
    key, cert = make_serving_cert(ca_key, ca_cert, APISERVER_NAMES, APISERVER_IPS, days=365)
    write_private(pki.serving_key, key_pem(key))
    write_public(pki.serving_cert, cert_pem(cert))
    sa_key = ec.generate_private_key(ec.SECP256R1())
    write_private(pki.sa_key, key_pem(sa_key))
    write_public(
        pki.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    for who, (user, groups) in IDENTITIES.items():
        key, cert = make_client_cert(ca_key, ca_cert, user, groups)
        write_private(pki.client_key(who), key_pem(key))
        write_public(pki.client_cert(who), cert_pem(cert))
        write_kubeconfig(
            pki.kubeconfig(who),
            server,
            pki.ca,
            user,
            {
                "client-certificate": str(pki.client_cert(who)),
                "client-key": str(pki.client_key(who)),
            },
        )
    return pki


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, credentials: dict) -> None:
    """A kubeconfig of one cluster, one user and one current context, named ``kcp``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "kcp", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "kcp", "context": {"cluster": "kcp", "user": user}}],
        "current-context": "kcp",
    }
    write_private(path, yaml.safe_dump(config, sort_keys=False).encode())
