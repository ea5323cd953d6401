"""The real server, started as deployed (``retry-webhook serve``: granian workers, TLS), over
HTTPS."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import socket
import ssl
import stat
import time
import warnings
from pathlib import Path

import pytest

from testkit.builders import P, apply, decode_patch, job, review
from testkit.servers import Server, free_port, run_serve, scaled, start, stop  # noqa: F401 - re-exported
from webhook.tls import certs


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start(tmp_path_factory.mktemp("certs"))
    yield srv
    stop(srv)


FULL = {
    P + "fail-non-retriable": "true",
    P + "backoff-limit": "3",
    P + "ignore-disruptions": "true",
}


def test_dev_certificates_are_generated_with_private_keys_0600(server):
    for name in ("ca.key", "tls.key"):
        mode = stat.S_IMODE(os.stat(server.cert_dir / name).st_mode)
        assert mode == 0o600, name
    cert = certs.check(server.cert_dir / "tls.crt", server.cert_dir / "tls.key")
    from cryptography import x509

    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = sans.get_values_for_type(x509.DNSName)
    assert "localhost" in names
    assert "retry-policy-webhook.retry-policy-webhook.svc" in names
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]


def test_mutate_over_tls(server):
    obj = job(FULL)
    body = review(obj, uid="uid-123")
    answer = server.review("/mutate", body)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "uid-123"
    assert answer["response"]["allowed"] is True
    out = apply(obj, decode_patch(answer))
    assert out["spec"]["backoffLimit"] == 3
    assert len(out["spec"]["podFailurePolicy"]["rules"]) == 2
    # kubectl is shown the four changes in one line, then the one warning.
    assert answer["response"]["warnings"] == [
        "retry-policy: 4 changes made: retry-webhook explain -f <manifest> shows each and the "
        "retry plan (CLI in the webhook's image)",
        "retry-policy: set spec.activeDeadlineSeconds: ignored disruptions retry with no cap",
    ]


def test_mutate_by_ip_address(server):
    status, _, _ = server.request("GET", "/healthz", host="127.0.0.1")
    assert status == 200


def test_validate_denies_with_reasons(server):
    obj = job({P + "backoff-limit": "lots", P + "bakoff": "1"})
    answer = server.review("/validate", review(obj))["response"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422
    assert "2 problems" in answer["status"]["message"]
    assert "patch" not in answer


def test_unknown_kind_passes(server):
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}
    answer = server.review("/mutate", review(obj))["response"]
    assert answer == {"uid": answer["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("body", "headers", "reason"),
    [
        ("{}", {"Content-Type": "text/plain"}, "Content-Type must be application/json"),
        ("{nope", {"Content-Type": "application/json"}, "not valid JSON"),
        ("[]", {"Content-Type": "application/json"}, "must be a JSON object"),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}
            ),
            {"Content-Type": "application/json"},
            "request.uid",
        ),
    ],
)
def test_malformed_requests_get_400_with_reason(server, body, headers, reason):
    status, ctype, raw = server.request("POST", "/mutate", body, headers)
    assert status == 400
    assert ctype == "application/json"
    assert reason in json.loads(raw)["reason"]


def test_wrong_method_and_path(server):
    status, _, raw = server.request("GET", "/mutate")
    assert status == 405 and json.loads(raw)["error"] == "MethodNotAllowed"
    status, _, raw = server.request("POST", "/nope", "{}", {"Content-Type": "application/json"})
    assert status == 404


def test_oversized_body_is_refused_before_it_is_read(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=scaled(10)) as raw:
        with server.context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(
                b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 104857600\r\n\r\n{"
            )
            started = time.monotonic()
            reply = tls.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413")
    assert time.monotonic() - started < scaled(5)


def _exchange(server, head: bytes, body_parts: list[bytes]) -> tuple[int, dict]:
    """One raw HTTP/1.1 exchange over TLS (for what http.client does not send: chunked
    bodies, bodies shorter than their Content-Length); the status and the JSON answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=scaled(10)) as raw:
        with server.context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(head)
            for part in body_parts:
                tls.sendall(part)
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                chunk = tls.recv(65536)
                if not chunk:
                    break
                reply += chunk
    header, _, body = reply.partition(b"\r\n\r\n")
    return int(header.split()[1]), json.loads(body)


def _chunked(data: bytes, size: int = 1 << 20) -> list[bytes]:
    parts = [
        f"{len(data[i : i + size]):x}\r\n".encode() + data[i : i + size] + b"\r\n"
        for i in range(0, len(data), size)
    ]
    return [*parts, b"0\r\n\r\n"]


CHUNKED_HEAD = (
    b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def test_a_chunked_review_is_read_to_its_end_and_answered(server):
    """A body without a Content-Length is read from the server's stream (it ends the
    stream at the last chunk): the patch is the one a Content-Length body gets."""
    obj = job(FULL)
    body = json.dumps(review(obj, uid="uid-chunked")).encode()
    status, answer = _exchange(server, CHUNKED_HEAD, _chunked(body, size=700))
    assert status == 200, answer
    assert answer["response"]["uid"] == "uid-chunked"
    assert apply(obj, decode_patch(answer)) == apply(
        obj, decode_patch(server.review("/mutate", review(obj)))
    )


def test_a_chunked_body_over_the_limit_is_refused(server):
    from webhook.serving.app import MAX_BODY_BYTES

    body = b'{"padding":"' + b"x" * MAX_BODY_BYTES + b'"}'
    status, answer = _exchange(server, CHUNKED_HEAD, _chunked(body))
    assert status == 413
    assert answer["error"] == "RequestEntityTooLarge"
    assert str(MAX_BODY_BYTES) in answer["reason"]


def test_a_body_shorter_than_its_content_length_is_a_bad_request():
    """A stream that ends before the announced length (a WSGI server that does not end it
    for us): a 400 naming why, not a decoding error about truncated JSON."""
    import io

    from webhook.serving.app import create_app

    body = json.dumps(review(job(FULL))).encode()
    environ = {
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body) + 100),
        "wsgi.input": io.BytesIO(body),
    }
    reply = create_app().test_client().post("/mutate", environ_overrides=environ)
    assert reply.status_code == 400
    assert reply.get_json()["reason"] == "request body shorter than its Content-Length"


class _Dropped:
    """An input stream whose client went away mid-body (a socket read raises OSError)."""

    def read(self, size: int = -1) -> bytes:
        raise ConnectionResetError("client went away")


@pytest.mark.parametrize("closed", [True, False], ids=["closed-stream", "dropped-client"])
def test_a_body_that_cannot_be_read_is_a_408_not_a_500(closed):
    import io

    from webhook.serving.app import create_app

    stream = io.BytesIO(b"{}")
    if closed:
        stream.close()  # reading raises ValueError
    environ = {
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "2",
        "wsgi.input": stream if closed else _Dropped(),
    }
    reply = create_app().test_client().post("/mutate", environ_overrides=environ)
    assert reply.status_code == 408
    assert reply.get_json() == {"error": "RequestTimeout", "reason": "request body not received"}


def test_a_body_without_a_length_from_a_server_that_does_not_end_it_is_not_read():
    """No Content-Length and no ``wsgi.input_terminated``: reading could block on the
    socket forever, so the body reads as empty (a 400), as werkzeug answers too."""
    import io

    from webhook.serving.app import read_body

    stream = io.BytesIO(b'{"never": "read"}')
    assert read_body({"wsgi.input": stream}, None) == b""
    assert stream.tell() == 0
    assert read_body({"wsgi.input": stream, "wsgi.input_terminated": True}, None) == (
        b'{"never": "read"}'
    )
    assert read_body({"wsgi.input": io.BytesIO(b"abcdef")}, 4) == b"abcd"


def test_readyz_reports_config_and_cache(server):
    status, _, raw = server.request("GET", "/readyz")
    body = json.loads(raw)
    assert status == 200
    assert body["status"] == "ready"
    assert body["attemptCache"] == {"enabled": False}


def test_tls_1_1_is_refused(server):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(server.cert_dir / "ca.crt"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = ssl.TLSVersion.TLSv1
            context.maximum_version = ssl.TLSVersion.TLSv1_1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client really offer TLS 1.1
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=scaled(10)) as raw:
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                tls.recv(10)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls_1_2_and_1_3_with_forward_secret_aead(server, version):
    context = ssl.create_default_context(cafile=str(server.cert_dir / "ca.crt"))
    context.minimum_version = context.maximum_version = version
    with socket.create_connection(("127.0.0.1", server.port), timeout=scaled(10)) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            name, protocol, _ = tls.cipher()
    assert protocol == version.name.replace("v", "v").replace("_", ".")
    if version is ssl.TLSVersion.TLSv1_2:
        assert name.startswith("ECDHE-") and ("GCM" in name or "CHACHA20" in name)


def test_plaintext_http_gets_no_answer(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=scaled(5))
    with pytest.raises((http.client.HTTPException, OSError)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    conn.close()


@pytest.mark.parametrize(
    ("start_days", "days", "expected"),
    [
        (-30, 1, ["expired on", "renew it"]),
        (2, 30, ["is not valid before", "check the clock"]),  # clock skew or a bad issuer
    ],
)
def test_certificate_outside_its_validity_refused_at_start(tmp_path, start_days, days, expected):
    ca_key, ca_cert = certs.make_ca()
    start = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=start_days)
    key, cert = certs.make_serving_cert(ca_key, ca_cert, ["localhost"], days=days, start=start)
    certs.write_private(tmp_path / "tls.key", certs.key_pem(key))
    certs.write_public(tmp_path / "tls.crt", certs.cert_pem(cert))
    result = run_serve(tmp_path)
    assert result.returncode == 2
    assert all(text in result.stderr for text in expected), result.stderr


def test_mismatched_key_refused_at_start(tmp_path):
    paths = certs.generate(tmp_path)
    certs.write_private(paths.key, certs.key_pem(certs.new_key()))
    result = run_serve(tmp_path)
    assert result.returncode == 2
    assert "does not belong to certificate" in result.stderr


def test_a_key_the_tls_layer_cannot_sign_with_is_refused_at_start(tmp_path):
    """rustls (granian's TLS layer) signs with RSA >= 2048, ECDSA P-256/P-384 and Ed25519
    only: a P-521 key is refused at start with the reason, not served to failing
    handshakes."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key, ca_cert = certs.make_ca()
    key = ec.generate_private_key(ec.SECP521R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certs.write_private(tmp_path / "tls.key", certs.key_pem(key))
    certs.write_public(tmp_path / "tls.crt", certs.cert_pem(cert))
    result = run_serve(tmp_path)
    assert result.returncode == 2
    assert "is not one the TLS layer can use" in result.stderr, result.stderr


def test_invalid_config_refused_at_start_with_every_problem(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("defaults: {backof-limit: 1, non-spot-attempts: x}\n")
    result = run_serve(tmp_path / "certs", "--config", str(config))
    assert result.returncode == 2
    assert "2 problem(s)" in result.stderr
    assert "did you mean backoff-limit?" in result.stderr


def test_certificate_check_now_parameter():
    ca_key, ca_cert = certs.make_ca()
    key, cert = certs.make_serving_cert(ca_key, ca_cert, ["localhost"], days=1)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        certs.write_private(d / "k", certs.key_pem(key))
        certs.write_public(d / "c", certs.cert_pem(cert))
        certs.check(d / "c", d / "k")
        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2)
        with pytest.raises(certs.CertError):
            certs.check(d / "c", d / "k", now=later)


def test_missing_certificates_where_none_can_be_written_are_a_clear_error(tmp_path):
    # Like a read-only Secret mount without the files: generation cannot write there
    # (a regular file in the path fails even for root).
    blocker = tmp_path / "mount"
    blocker.write_text("not a directory")
    result = run_serve(blocker / "tls")
    assert result.returncode == 2
    assert "no tls.crt and tls.key in" in result.stderr and "cannot be generated" in result.stderr


def _siblings(count: int) -> list[dict]:
    """Jobs of one CronJob: one template, each with its own name, uid and schedule time."""
    jobs = []
    for i in range(count):
        obj = job(FULL, name=f"nightly-{i}")
        obj["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"] = (
            f"2026-11-22T0{i}:00:00Z"
        )
        jobs.append(obj)
    return jobs


@pytest.mark.parametrize(
    ("flags", "memo"),
    [
        ((), {"entries": 1, "hits": 2, "misses": 1}),
        (("--memo-entries", "0"), {"entries": 0, "hits": 0, "misses": 3}),
    ],
)
def test_jobs_of_one_template_are_answered_from_memory(tmp_path, flags, memo):
    srv = start(tmp_path / "certs", *flags)
    try:
        answers = [srv.review("/mutate", review(obj))["response"] for obj in _siblings(3)]
        stats = json.loads(srv.request("GET", "/readyz")[2])["memo"]
    finally:
        stop(srv)
    assert stats == memo
    assert answers[0]["patch"] == answers[1]["patch"] == answers[2]["patch"]
    for obj, answer in zip(_siblings(3), answers, strict=True):
        assert apply(obj, decode_patch({"response": answer}))["spec"]["backoffLimit"] == 3


def test_workers_move_their_startup_heap_out_of_the_collectors_reach():
    import gc

    from webhook.serving.worker import settle_heap

    try:
        settle_heap()
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("value", ["-1", "many", "2.5"])
def test_a_bad_memo_size_is_refused_with_a_usage_error(tmp_path, value):
    result = run_serve(tmp_path / "certs", "--memo-entries", value)
    assert result.returncode == 2
    assert f"--memo-entries: {value!r} is not a whole number >= 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_connections_are_spread_over_the_workers(tmp_path):
    """Each worker listens on its own socket (SO_REUSEPORT): kept-alive connections
    opened together are spread over the workers by the kernel, not raced for (where a
    batch mostly went to one worker, and the other's core stayed idle)."""
    srv = start(tmp_path / "certs", workers=2)
    try:
        # One per worker, none shared; twice: the serving generation's, and the next's
        # (webhook.serving.listeners.Listeners).
        assert _listening_sockets(srv.port) == 4
        # As a load generator (or an API server under a burst) opens them: all at once.
        sockets = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(40)]
        uids = [f"spread-{index}" for index in range(40)]
        for index, sock in enumerate(sockets):
            conn = http.client.HTTPSConnection("localhost", srv.port, context=srv.context)
            conn.sock = srv.context.wrap_socket(sock, server_hostname="localhost")
            body = review(job(FULL, name=uids[index]), uid=uids[index])
            conn.request("POST", "/mutate", json.dumps(body), {"Content-Type": "application/json"})
            assert conn.getresponse().read()
            sockets[index] = conn
        for conn in sockets:
            conn.close()
    finally:
        stop(srv)  # (decision lines are written in batches, all of them by the exit)
    served: dict[int, int] = {}
    for line in srv.logs():
        if line.get("msg") == "admission decision" and line.get("uid") in uids:
            served[line["pid"]] = served.get(line["pid"], 0) + 1
    assert sum(served.values()) == 40
    # Spread by a hash of their addresses: fewer than 6 of 40 on one worker has a
    # probability of about 1e-6; a race for accept put all of a batch on one worker.
    assert len(served) == 2 and min(served.values()) >= 6, served


def test_a_second_server_on_the_same_port_refuses_to_start(server, tmp_path):
    """Sockets bound with SO_REUSEPORT would share the port with another such server:
    the start checks the port is free first."""
    result = run_serve(tmp_path / "certs", port=server.port)
    assert result.returncode == 2  # the input (here, the port) is unusable
    assert f"cannot listen on 127.0.0.1:{server.port}" in result.stderr
    assert "Traceback" not in result.stderr


def _listening_sockets(port: int) -> int:
    """Sockets listening on ``port`` (IPv4), from the kernel's own table."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if row[1].endswith(f":{port:04X}") and row[3] == "0A")


# --- issue 22 part B through the server as deployed: the operators and Flyte ---------------


def _admitted(manifest):
    from testkit.workloads import admitted

    return admitted(manifest)


def _pytorchjob(annotations, **spec):
    replica = {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch"}]}}}
    return _admitted(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "finetune", "annotations": annotations},
            "spec": {"pytorchReplicaSpecs": {"Master": replica, "Worker": replica}, **spec},
        }
    )


def _jobset(annotations, failure_policy):
    job_spec = {
        "completions": 1,
        "parallelism": 1,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main"}]}},
    }
    return _admitted(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "pretrain", "annotations": annotations},
            "spec": {
                "failurePolicy": failure_policy,
                "replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job_spec}}],
            },
        }
    )


def _both(server, obj):
    """The mutating and the validating answer to one object."""
    return [server.review(path, review(obj))["response"] for path in ("/mutate", "/validate")]


def test_a_pytorchjob_never_loses_its_cap_over_tls(server):
    # upstream: ReconcileJobs (FakeWorkQueue.NumRequeues is 0) and PastBackoffLimit in
    # training-operator release-1.9 never enforce runPolicy.backoffLimit >= 1 under ExitCode.
    obj = _pytorchjob({P + "fail-non-retriable": "true", P + "backoff-limit": "3"})
    for answer in _both(server, obj):
        assert answer["allowed"] is False
        assert "(kubeflow/trainer#2045)" in answer["status"]["message"]
    answer = server.review(
        "/mutate", review(_pytorchjob({P + "fail-non-retriable": "true", P + "backoff-limit": "0"}))
    )["response"]
    assert answer["allowed"] is True


def test_error_propagation_only_where_flyte_reads_the_files_over_tls(server):
    # upstream: flytekit's _build_error_file_name writes error-<uuid>.pb; only the PyTorch
    # plugin's earliest-file reader (flyteplugins ioutils) lists those.
    for answer in _both(server, job({P + "error-propagation": "earliest"})):
        assert answer["allowed"] is False
        assert "error-<uuid>.pb instead of error.pb" in answer["status"]["message"]
    answer = server.review("/mutate", review(_pytorchjob({P + "error-propagation": "earliest"})))[
        "response"
    ]
    assert answer["allowed"] is True
    # What error-propagation assumes is said with its change: in kubectl's one line of
    # changes, each of which explain and dry-run say.
    assert answer["warnings"][0].startswith("retry-policy: 3 changes made: ")


def test_jobset_patterns_in_place_restarts_and_uncounted_restarts_over_tls(server):
    # upstream: ruleIsApplicable (jobset pkg/controllers/failure_policy.go) with the message
    # of matchPodFailurePolicy (kubernetes pkg/controller/job/pod_failure_policy.go).
    restart = {
        "name": "restartAll",
        "action": "RestartJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": [".*"],
    }
    obj = _jobset({P + "fail-non-retriable": "true"}, {"rules": [restart]})
    for answer in _both(server, obj):
        assert answer["allowed"] is False
        assert "(its pattern /.*/ matches the Job's message" in answer["status"]["message"]
    # upstream: validateCreate in jobset pkg/webhooks/jobset_webhook.go requires 2147483647.
    obj = _jobset({P + "backoff-limit": "2"}, {"restartStrategy": "InPlaceRestart"})
    answer = server.review("/mutate", review(obj))
    assert answer["response"]["allowed"] is True
    child = apply(obj, decode_patch(answer))["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert child["backoffLimit"] == 2147483647
    forever = {
        "name": "forever",
        "action": "RestartJobSetAndIgnoreMaxRestarts",
        "onJobFailureReasons": ["BackoffLimitExceeded"],
    }
    for answer in _both(server, _jobset({P + "backoff-limit": "2"}, {"rules": [forever]})):
        assert answer["allowed"] is False
        assert "would bound nothing" in answer["status"]["message"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("42", 42), ("0", 0), (" 7 ", 7), (None, None), ("", 0), ("-1", 0), ("4x", 0), ("٣", 0)],
)
def test_a_content_length_is_read_as_werkzeug_reads_it(value, expected):
    """The envelope reads the length from the environ (cheaper than werkzeug's accessor),
    with werkzeug's reading: what is not a whole number is a length of 0."""
    from werkzeug.wrappers import Request

    from webhook.serving.app import _content_length

    environ = {} if value is None else {"CONTENT_LENGTH": value}
    assert _content_length(environ) == expected
    assert Request(environ).content_length == expected
