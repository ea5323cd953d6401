"""Certificate rotation under load, on the real server (2 workers, TLS).

Concurrent HTTPS clients send real AdmissionReviews, over kept-alive connections and
over a fresh connection each, while the serving certificate is rotated twice:

1. the way the kubelet updates a mounted Secret: a new timestamped directory and an
   atomic swap of the ``..data`` symlink (the visible ``tls.crt``/``tls.key`` are
   symlinks that never change themselves);
2. non-atomically: the new certificate is written before its key, and the mismatched
   pair stays on disk until every worker has seen it.

No request may fail; fresh connections must see the new certificate once it is whole,
and never the half-written pair.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from pathlib import Path

from cryptography import x509

from testkit.builders import P, job, review
from testkit.servers import (
    KubeletVolume,
    Threads,
    eventually,
    free_port,
    metric,
    scaled,
    start,
    stop,
)
from webhook.tls import certs

NAMES = ["localhost", *certs.service_dns_names(certs.DEFAULT_SERVICE, certs.DEFAULT_NAMESPACE)]
BODY = {P + "backoff-limit": "2", P + "fail-non-retriable": "true"}


def serving_pair(ca_key, ca_cert) -> tuple[bytes, bytes, int]:
    key, cert = certs.make_serving_cert(ca_key, ca_cert, NAMES, ["127.0.0.1"], days=30)
    return certs.cert_pem(cert), certs.key_pem(key), cert.serial_number


class Load(Threads):
    """Clients sending reviews until stopped; every failure is recorded, never raised."""

    join_timeout = 30.0

    def __init__(self, port: int, ca_file: Path):
        self.port = port
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.failures: list[str] = []
        self.requests = 0
        self.fresh_serials: list[int] = []
        self.threads = [threading.Thread(target=self._keepalive) for _ in range(2)]
        self.threads += [threading.Thread(target=self._fresh) for _ in range(2)]

    def _connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "localhost", self.port, context=self.context, timeout=scaled(10)
        )

    def _send(self, conn: http.client.HTTPSConnection) -> None:
        body = review(job(BODY))
        conn.request("POST", "/mutate", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        answer = json.loads(raw)["response"]
        if response.status != 200 or answer["uid"] != body["request"]["uid"]:
            raise AssertionError(f"HTTP {response.status}: {raw[:200]!r}")
        if not (answer["allowed"] and answer.get("patchType") == "JSONPatch"):
            raise AssertionError(f"unexpected answer {answer}")

    def _record(self, err: BaseException | None) -> None:
        with self.lock:
            self.requests += 1
            if err is not None:
                self.failures.append(f"{type(err).__name__}: {err}")

    def _keepalive(self) -> None:
        conn = self._connection()
        for _ in range(100_000):  # bounded; stopped by the test long before
            if self.stop.is_set():
                break
            try:
                self._send(conn)
                self._record(None)
            except Exception as err:
                self._record(err)
                conn.close()
                conn = self._connection()
        conn.close()

    def _fresh(self) -> None:
        for _ in range(100_000):
            if self.stop.is_set():
                break
            conn = self._connection()
            try:
                conn.connect()  # the certificate this new connection was served
                der = conn.sock.getpeercert(binary_form=True)
                self._send(conn)
                with self.lock:
                    self.fresh_serials.append(x509.load_der_x509_certificate(der).serial_number)
                self._record(None)
            except Exception as err:
                self._record(err)
            finally:
                conn.close()

    def serials_since(self, index: int) -> list[int]:
        with self.lock:
            return self.fresh_serials[index:]

    def mark(self) -> int:
        with self.lock:
            return len(self.fresh_serials)


def all_fresh_see(load: Load, serial: int, count: int = 12):
    """Wait until the last ``count`` fresh connections all got certificate ``serial``:
    with 2 workers accepting at random, that means both workers serve it."""

    def check():
        recent = load.serials_since(0)[-count:]
        return len(recent) == count and set(recent) == {serial}

    eventually(check, timeout=15)


def deferred_pids(server) -> list[int]:
    """Who logged that a version of the files was refused (one line per refusal)."""
    return [
        line["pid"]
        for line in server.logs()
        if line.get("msg", "").startswith("certificate reload deferred")
    ]


def test_rotation_under_load_drops_nothing(tmp_path):
    ca_key, ca_cert = certs.make_ca()
    root = tmp_path / "tls"
    root.mkdir()
    volume = KubeletVolume(root)
    cert1, key1, serial1 = serving_pair(ca_key, ca_cert)
    volume.publish({"tls.crt": cert1, "tls.key": key1})
    certs.write_public(root / "ca.crt", certs.cert_pem(ca_cert))
    metrics_port = free_port()
    server = start(root, workers=2, metrics_port=metrics_port)
    try:
        with Load(server.port, root / "ca.crt") as load:
            all_fresh_see(load, serial1)

            # 1. kubelet-style: new directory, atomic ..data swap
            cert2, key2, serial2 = serving_pair(ca_key, ca_cert)
            volume.publish({"tls.crt": cert2, "tls.key": key2})
            all_fresh_see(load, serial2)

            # 2. non-atomic: the certificate first; the old key stays until the supervisor
            #    has looked at the mismatched pair (and refused it, once)
            cert3, key3, serial3 = serving_pair(ca_key, ca_cert)
            mark = load.mark()
            certs.write_public(volume.current() / "tls.crt", cert3)
            eventually(lambda: deferred_pids(server) == [server.proc.pid], timeout=15)
            eventually(lambda: len(load.serials_since(mark)) >= 6, timeout=15)
            half_written = load.serials_since(mark)
            certs.write_private(volume.current() / "tls.key", key3)
            all_fresh_see(load, serial3)
        assert load.failures == [], load.failures[:5]
        assert load.requests > 100  # the load really ran throughout
        # while the pair was mismatched, every new connection still got the whole old pair
        assert half_written and set(half_written) == {serial2}
        samples = server.metrics()
        assert metric(samples, "retry_webhook_certificate_reloads_total", result="success") == 2
        assert metric(samples, "retry_webhook_certificate_reloads_total", result="failure") == 1
        # The earliest expiry any live worker serves: the new one's, once the workers of
        # the previous certificate have drained and stopped.
        expiry = x509.load_pem_x509_certificate(cert3).not_valid_after_utc.timestamp()
        eventually(
            lambda: (
                metric(server.metrics(), "retry_webhook_certificate_expiry_timestamp_seconds")
                == expiry
            )
        )
    finally:
        stop(server)
    assert server.proc.returncode == 0
    server.logs()  # every line JSON


def test_sighup_replaces_every_worker_without_failing_a_request(tmp_path):
    """SIGHUP starts a new generation of workers, as a new certificate does (e.g. after
    a change the workers do not watch themselves): under load, none of the requests on
    kept-alive or new connections fails, and every old worker is gone after its drain."""
    import os
    import signal

    from testkit.servers import worker_pids

    server = start(tmp_path / "certs", workers=2)
    try:
        old = worker_pids(server.proc.pid)
        with Load(server.port, tmp_path / "certs" / "ca.crt") as load:
            eventually(lambda: load.requests > 20)
            os.kill(server.proc.pid, signal.SIGHUP)

            def replaced() -> bool:
                now = worker_pids(server.proc.pid)
                return len(now) == 2 and not now & old

            eventually(replaced, timeout=20)
            mark = load.requests
            eventually(lambda: load.requests > mark + 20)
        assert load.failures == [], load.failures[:5]
        lines = server.logs()
        assert sum(line["msg"] == "worker stopped" for line in lines) == 2
        assert not [line for line in lines if line["level"] == "error"]
    finally:
        stop(server)
    assert server.proc.returncode == 0
