"""``retry-webhook certs --in-cluster``: the real ``kubernetes`` client against an HTTP
Kubernetes API (testkit/fakeapi/) that stores Secrets and webhook configurations with the
API's write semantics (404, 409 AlreadyExists/Conflict, resourceVersion preconditions)."""

from __future__ import annotations

import base64
import datetime as dt
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from cryptography import x509
from kubernetes import client

from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import scaled
from webhook.tls import certs
from webhook.tls import incluster as certsync

BIN = Path(sys.executable).parent / "retry-webhook"
NS, SVC, SECRET = "rpw-system", "rpw", "rpw-tls"
MUTATING, VALIDATING = "rpw-mutating", "rpw-validating"
SECRETS = "secrets"
MWC, VWC = "mutatingwebhookconfigurations", "validatingwebhookconfigurations"
UTC = dt.timezone.utc


@pytest.fixture
def api():
    fake = FakeAPI().start()
    yield fake
    fake.stop()


def webhook_config(kind: str, name: str, hooks: int) -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"hook{i}.retry-policy.dev",
                "clientConfig": {"service": {"name": SVC, "namespace": NS, "path": "/mutate"}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
            }
            for i in range(hooks)
        ],
    }


def install_configs(api: FakeAPI) -> None:
    api.store(MWC, webhook_config("MutatingWebhookConfiguration", MUTATING, 2))
    api.store(VWC, webhook_config("ValidatingWebhookConfiguration", VALIDATING, 1))


class Run:
    """CertSync with a controllable clock and a recorded sleep."""

    def __init__(self, api: FakeAPI):
        configuration = client.Configuration(host=api.url)
        api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(api_client)
        self.admission = client.AdmissionregistrationV1Api(api_client)
        self.sleeps: list[float] = []

    def __call__(self, now: dt.datetime | None = None, **kwargs) -> list[str]:
        refs = kwargs.pop(
            "refs",
            [
                certsync.WebhookConfigRef(MUTATING, certsync.MUTATING),
                certsync.WebhookConfigRef(VALIDATING, certsync.VALIDATING),
            ],
        )
        options = certsync.Options(
            secret=SECRET,
            namespace=NS,
            service=kwargs.pop("service", SVC),
            webhook_configs=refs,
            **{"days": 90, **kwargs},
        )
        clock = (lambda: now) if now else certs._now
        return certsync.CertSync(
            self.core, self.admission, options, now=clock, sleep=self.sleeps.append
        ).run()


@pytest.fixture
def run(api):
    return Run(api)


def secret_data(api: FakeAPI) -> dict[str, bytes]:
    secret = api.get(SECRETS, SECRET, NS)
    assert secret is not None
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def bundles(api: FakeAPI) -> list[bytes]:
    out = []
    for resource, name in ((MWC, MUTATING), (VWC, VALIDATING)):
        for hook in api.get(resource, name)["webhooks"]:
            out.append(base64.b64decode(hook["clientConfig"]["caBundle"]))
    return out


def handshake(cert_pem: bytes, key_pem: bytes, ca_bundle: bytes, hostname: str) -> None:
    """A real TLS handshake: a server with the Secret's pair, a client trusting caBundle."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as tmp:
        certs.write_public(Path(tmp) / "c", cert_pem)
        certs.write_private(Path(tmp) / "k", key_pem)
        server_ctx.load_cert_chain(str(Path(tmp) / "c"), str(Path(tmp) / "k"))
    client_ctx = ssl.create_default_context(cadata=ca_bundle.decode())
    left, right = socket.socketpair()
    errors: list[BaseException] = []

    def serve():
        try:
            with server_ctx.wrap_socket(left, server_side=True) as tls:
                tls.recv(1)
        except (OSError, ssl.SSLError) as err:
            errors.append(err)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(right, server_hostname=hostname) as tls:
            tls.sendall(b"x")
    finally:
        thread.join(scaled(5))
    assert not errors, errors


def test_first_run_creates_the_secret_and_sets_every_ca_bundle(api, run):
    install_configs(api)
    actions = run()
    secret = api.get(SECRETS, SECRET, NS)
    assert secret["type"] == "kubernetes.io/tls"
    data = secret_data(api)
    assert set(data) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    cert = certs.check_pem(data["tls.crt"], data["tls.key"])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {
        SVC,
        f"{SVC}.{NS}",
        f"{SVC}.{NS}.svc",
        f"{SVC}.{NS}.svc.cluster.local",
    }
    # every webhook entry of both configurations trusts exactly the Secret's CA bundle
    assert bundles(api) == [data["ca.crt"]] * 3
    handshake(data["tls.crt"], data["tls.key"], bundles(api)[0], f"{SVC}.{NS}.svc")
    assert any("created" in a for a in actions)
    # bundle first, Secret last
    assert [w[0] for w in api.writes] == ["PATCH", "PATCH", "POST"]


def test_second_run_changes_nothing(api, run):
    install_configs(api)
    run()
    before = secret_data(api)
    api.writes.clear()
    actions = run()
    assert api.writes == []
    assert secret_data(api) == before
    assert f"secret {NS}/{SECRET}: unchanged (certificates valid)" in actions
    assert f"mutatingwebhookconfiguration {MUTATING}: caBundle up to date" in actions


def test_pre_install_without_webhook_configurations_creates_the_secret(api, run):
    actions = run()
    assert secret_data(api)["tls.crt"]
    assert f"mutatingwebhookconfiguration {MUTATING}: not found, skipped (not created yet)" in (
        actions
    )
    install_configs(api)  # what Helm does between pre-install and post-install
    run()
    assert bundles(api) == [secret_data(api)["ca.crt"]] * 3


def test_generic_webhook_config_flag_finds_either_kind(api, run):
    install_configs(api)
    refs = [certsync.WebhookConfigRef(MUTATING), certsync.WebhookConfigRef(VALIDATING)]
    run(refs=refs)
    assert bundles(api) == [secret_data(api)["ca.crt"]] * 3


def test_forbidden_configuration_is_an_error_not_a_skip(api, run):
    install_configs(api)
    api.forbidden.add((MWC, MUTATING))
    with pytest.raises(certsync.SyncError, match="not allowed to read"):
        run()


def store_secret(api: FakeAPI, ca_key, ca_cert, key, cert, **extra) -> None:
    data = {
        "tls.crt": certs.cert_pem(cert),
        "tls.key": certs.key_pem(key),
        "ca.crt": certs.cert_pem(ca_cert),
        "ca.key": certs.key_pem(ca_key),
    }
    api.store(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": extra.pop("type", "kubernetes.io/tls"),
            "metadata": {"name": SECRET, "namespace": NS, "labels": {"keep": "me"}},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
            **extra,
        },
    )


def names(service: str = SVC) -> list[str]:
    return certs.service_dns_names(service, NS)


def test_serving_certificate_is_renewed_within_renew_before(api, run):
    install_configs(api)
    now = certs._now()
    ca_key, ca_cert = certs.make_ca(days=3650, start=now - dt.timedelta(days=10))
    key, cert = certs.make_serving_cert(
        ca_key, ca_cert, names(), days=40, start=now - dt.timedelta(days=20)
    )
    store_secret(api, ca_key, ca_cert, key, cert)
    run(renew_before_days=30)  # 20 days left < 30: renew
    data = secret_data(api)
    new = x509.load_pem_x509_certificate(data["tls.crt"])
    assert new.serial_number != cert.serial_number
    assert new.not_valid_after_utc > now + dt.timedelta(days=89)
    assert data["ca.crt"] == certs.cert_pem(ca_cert)  # the CA is kept
    new.verify_directly_issued_by(ca_cert)
    secret = api.get(SECRETS, SECRET, NS)
    assert secret["metadata"]["labels"] == {"keep": "me"}  # other fields kept


def test_default_renewal_is_at_two_thirds_of_the_lifetime(api, run):
    now = certs._now()
    ca_key, ca_cert = certs.make_ca(days=3650, start=now - dt.timedelta(days=100))
    young_key, young = certs.make_serving_cert(
        ca_key, ca_cert, names(), days=90, start=now - dt.timedelta(days=50)
    )
    store_secret(api, ca_key, ca_cert, young_key, young)
    run()
    assert api.writes == []  # 50 of 90 days: not due
    old_key, old = certs.make_serving_cert(
        ca_key, ca_cert, names(), days=90, start=now - dt.timedelta(days=61)
    )
    store_secret(api, ca_key, ca_cert, old_key, old)
    run()
    renewed = x509.load_pem_x509_certificate(secret_data(api)["tls.crt"])
    assert renewed.serial_number != old.serial_number


@pytest.mark.parametrize("problem", ["mismatched key", "service renamed", "other CA", "garbage"])
def test_unusable_serving_certificate_is_reissued(api, run, problem):
    ca_key, ca_cert = certs.make_ca()
    key, cert = certs.make_serving_cert(ca_key, ca_cert, names())
    service = SVC
    if problem == "mismatched key":
        key = certs.new_key()
    elif problem == "service renamed":
        service = "renamed"
    elif problem == "other CA":
        other_key, other_ca = certs.make_ca()
        key, cert = certs.make_serving_cert(other_key, other_ca, names())
    store_secret(api, ca_key, ca_cert, key, cert)
    if problem == "garbage":
        secret = api.get(SECRETS, SECRET, NS)
        secret["data"]["tls.crt"] = base64.b64encode(b"not a certificate").decode()
        api.store(SECRETS, secret)
    run(service=service)
    data = secret_data(api)
    new = certs.check_pem(data["tls.crt"], data["tls.key"])
    new.verify_directly_issued_by(ca_cert)
    assert f"{service}.{NS}.svc" in new.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)


def test_ca_rollover_trusts_old_and_new_until_the_old_one_is_unused(api, run):
    install_configs(api)
    now = certs._now()
    old_ca_key, old_ca = certs.make_ca(days=300, start=now - dt.timedelta(days=290))
    old_key, old_cert = certs.make_serving_cert(
        old_ca_key, old_ca, names(), days=90, start=now - dt.timedelta(days=1)
    )
    store_secret(api, old_ca_key, old_ca, old_key, old_cert)
    api.writes.clear()

    actions = run(now=now)
    data = secret_data(api)
    trusted = x509.load_pem_x509_certificates(data["ca.crt"])
    assert len(trusted) == 2 and trusted[1] == old_ca
    new_ca = trusted[0]
    assert new_ca.not_valid_after_utc > now + dt.timedelta(days=3000)
    assert data["ca.key"] != certs.key_pem(old_ca_key)
    assert any("CA rollover" in a for a in actions)
    # The sequence: both configurations trust old+new, then a pause, then the Secret.
    assert [w[0] for w in api.writes] == ["PATCH", "PATCH", "PUT"]
    assert run.sleeps == [certsync.SETTLE_SECONDS]
    assert bundles(api) == [data["ca.crt"]] * 3
    # A pod that has not reloaded yet (old certificate) and one that has are both trusted.
    handshake(certs.cert_pem(old_cert), certs.key_pem(old_key), data["ca.crt"], f"{SVC}.{NS}.svc")
    handshake(data["tls.crt"], data["tls.key"], data["ca.crt"], f"{SVC}.{NS}.svc")
    x509.load_pem_x509_certificate(data["tls.crt"]).verify_directly_issued_by(new_ca)

    api.writes.clear()
    run(now=now + dt.timedelta(hours=1))  # within the overlap: nothing changes
    assert api.writes == []

    run(now=now + certsync.CA_OVERLAP + dt.timedelta(minutes=10))
    later = secret_data(api)
    assert x509.load_pem_x509_certificates(later["ca.crt"]) == [new_ca]
    assert later["tls.crt"] == data["tls.crt"]  # the serving certificate stays
    assert bundles(api) == [later["ca.crt"]] * 3
    with pytest.raises(ssl.SSLError):  # the old certificate is no longer trusted
        handshake(
            certs.cert_pem(old_cert), certs.key_pem(old_key), later["ca.crt"], f"{SVC}.{NS}.svc"
        )


@pytest.mark.parametrize(("age_days", "rolled"), [(2400, False), (2450, True)])
def test_ca_rolls_over_at_two_thirds_of_its_life_whatever_renew_before(api, run, age_days, rolled):
    now = certs._now()
    ca_key, ca_cert = certs.make_ca(days=3650, start=now - dt.timedelta(days=age_days))
    key, cert = certs.make_serving_cert(ca_key, ca_cert, names(), days=365)
    store_secret(api, ca_key, ca_cert, key, cert)
    run(renew_before_days=30, settle_seconds=0)
    trusted = x509.load_pem_x509_certificates(secret_data(api)["ca.crt"])
    assert len(trusted) == (2 if rolled else 1)  # 2/3 of 3650 days is day 2433


def test_conflicting_writers_are_retried(api, run):
    install_configs(api)
    ca_key, ca_cert = certs.make_ca()
    key, cert = certs.make_serving_cert(ca_key, ca_cert, names("old-name"))
    store_secret(api, ca_key, ca_cert, key, cert)
    touched: list[tuple[str, str]] = []

    def concurrent_writer(method, resource, name):
        # Another writer changes each object once, just before our first write to it.
        if (resource, name) not in touched and method in ("PUT", "PATCH"):
            touched.append((resource, name))
            api.touch(resource, name, NS if resource == SECRETS else "")

    api.before_write = concurrent_writer
    run()
    assert sorted(api.failed_writes) == sorted(
        [("PATCH", MUTATING, 409), ("PATCH", VALIDATING, 409), ("PUT", SECRET, 409)]
    )
    data = secret_data(api)
    certs.check_pem(data["tls.crt"], data["tls.key"])
    assert bundles(api) == [data["ca.crt"]] * 3
    secret = api.get(SECRETS, SECRET, NS)
    assert "touched" in secret["metadata"]["labels"]  # the other writer's change survived


def test_concurrent_create_is_an_already_exists_then_reread(api, run):
    def other_job_creates_first(method, resource, meta):
        if method == "POST" and api.get(SECRETS, SECRET, NS) is None:
            ca_key, ca_cert = certs.make_ca()
            key, cert = certs.make_serving_cert(ca_key, ca_cert, names())
            store_secret(api, ca_key, ca_cert, key, cert)

    api.before_write = other_job_creates_first
    run()
    assert api.failed_writes == [("POST", SECRET, 409)]
    assert api.writes == []  # the other run's valid Secret was kept


@pytest.mark.parametrize(
    ("extra", "message"),
    [({"type": "Opaque"}, "has type Opaque"), ({"immutable": True}, "is immutable")],
)
def test_unwritable_secret_is_refused_with_a_clear_error(api, run, extra, message):
    ca_key, ca_cert = certs.make_ca()
    key, cert = certs.make_serving_cert(ca_key, ca_cert, names("other"))
    store_secret(api, ca_key, ca_cert, key, cert, **extra)
    before = api.get(SECRETS, SECRET, NS)
    with pytest.raises(certsync.SyncError, match=message):
        run()
    assert api.get(SECRETS, SECRET, NS) == before


def test_renew_before_must_be_below_the_lifetime(run):
    with pytest.raises(certsync.SyncError, match="every run would renew"):
        run(days=30, renew_before_days=30)


def certs_cli(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    """``retry-webhook certs --in-cluster ...`` as the chart's Job runs it, against ``url``."""
    env = {**os.environ, "KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", url))}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run(
        [str(BIN), "certs", "--in-cluster", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(120),
        check=False,
    )


def test_command_line_as_the_chart_runs_it(api, tmp_path):
    install_configs(api)
    common = ["--secret", SECRET, "--namespace", NS, "--service", SVC]
    first = certs_cli(
        tmp_path,
        api.url,
        *common,
        *("--webhook-config", MUTATING, "--webhook-config", VALIDATING),
        *("--days", "365", "--renew-before", "30"),
    )
    assert first.returncode == 0, first.stderr
    assert f"secret {NS}/{SECRET}: created" in first.stdout
    data = secret_data(api)
    assert bundles(api) == [data["ca.crt"]] * 3
    assert b"PRIVATE KEY" not in (first.stdout + first.stderr).encode()
    # The chart's spelling of the flags; a second run changes nothing.
    api.writes.clear()
    second = certs_cli(
        tmp_path,
        api.url,
        *common,
        *("--mutating-webhook-config", MUTATING, "--validating-webhook-config", VALIDATING),
        *("--days", "365", "--renew-before-days", "30"),
    )
    assert second.returncode == 0, second.stderr
    assert "unchanged" in second.stdout
    assert api.writes == []


def test_command_line_errors_exit_2_with_the_reason(api, tmp_path):
    result = certs_cli(tmp_path, api.url, "--namespace", NS)
    assert result.returncode == 2
    assert "--in-cluster needs --secret" in result.stderr


def test_unreachable_api_exits_1_so_the_job_retries(tmp_path):
    from testkit.servers import free_port

    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    result = certs_cli(tmp_path, closed, "--secret", SECRET, "--namespace", NS)
    assert result.returncode == 1
    assert f"cannot read secret {NS}/{SECRET}" in result.stderr
    assert "Traceback" not in result.stderr
