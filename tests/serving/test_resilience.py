"""The real server under hostile clients and faults: slow clients, many connections,
client-certificate authentication, a worker killed under load, SIGTERM under load."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import threading
import time

import pytest

from benchmarks.slowclients import read_response
from testkit.builders import FULL, job, review
from testkit.servers import Threads, eventually, scaled, start, stop, worker_pids
from testkit.tools import ROOT
from webhook.tls import certs

BODY = json.dumps(review(job(FULL))).encode()


def raw_request(body: bytes = BODY) -> bytes:
    return (
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def tls(server, context=None, timeout: float = 10) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return (context or server.context).wrap_socket(raw, server_hostname="localhost")


def one_review(server) -> bool:
    """A complete review on a fresh connection; True when it was answered with 200."""
    try:
        with tls(server) as sock:
            sock.sendall(raw_request())
            status, body = read_response(sock)
        return status == 200 and json.loads(body)["response"]["allowed"] is True
    except (OSError, ValueError):
        return False


@pytest.fixture
def server(tmp_path):
    srv = start(tmp_path / "certs", workers=1)
    yield srv
    stop(srv)


def test_slow_clients_do_not_block_others(server):
    """Two clients dripping a request a byte at a time hold no thread (their bytes wait
    on the worker's event loop); every other request is answered meanwhile.
    (Thousands of them: tests/serving/test_slowclients.py.)"""
    stop_dripping = threading.Event()
    dripped = []

    def drip():
        with tls(server) as sock:
            for byte in raw_request():
                if stop_dripping.is_set():
                    break
                sock.sendall(bytes([byte]))
                dripped.append(1)
                time.sleep(0.05)

    slow = [threading.Thread(target=drip, daemon=True) for _ in range(2)]
    for thread in slow:
        thread.start()
    while len(dripped) < 20:  # both are mid-request
        time.sleep(0.01)
    answered = [one_review(server) for _ in range(20)]
    still_dripping = all(thread.is_alive() for thread in slow)
    stop_dripping.set()
    assert answered == [True] * 20
    assert still_dripping  # the slow requests were in progress the whole time


def test_many_kept_alive_connections(server):
    """Hundreds of kept-alive connections (as the API server's pool keeps them, idle after
    a request) wait on the event loop and hold no thread: new requests are still answered."""
    idle = []
    try:
        for _ in range(200):
            sock = tls(server)
            sock.sendall(raw_request())
            assert read_response(sock)[0] == 200
            idle.append(sock)
        assert [one_review(server) for _ in range(10)] == [True] * 10
        idle[0].sendall(raw_request())  # and an idle one still works afterwards
        assert read_response(idle[0])[0] == 200
    finally:
        for sock in idle:
            sock.close()


def test_stalled_connections_are_dropped_quietly(tmp_path):
    """Clients that finish the TLS handshake (or start a request) and go silent are closed
    after --read-timeout (here both the header and the body timeout), without an error
    logged per client (a flood of them must not flood the logs); the worker answers
    throughout."""
    srv = start(tmp_path / "certs", "--read-timeout", "1", workers=1)
    try:
        stalled = [tls(srv) for _ in range(3)]
        stalled += [tls(srv) for _ in range(3)]
        for sock in stalled[3:]:
            sock.sendall(raw_request()[:40])  # half a request line, then silence
        assert [one_review(srv) for _ in range(5)] == [True] * 5
        for sock in stalled:
            sock.settimeout(30)
            assert sock.recv(1024) == b""  # closed by the server, not by our timeout
        assert [one_review(srv) for _ in range(5)] == [True] * 5
        for sock in stalled:
            sock.close()
        assert "Traceback" not in srv.output()
        assert not [line for line in srv.logs() if line["level"] in ("error", "critical")]
    finally:
        stop(srv)


def test_client_certificate_authentication(tmp_path):
    """With --client-ca, only callers presenting a certificate from that CA (the API
    server) complete the handshake; a changed bundle is used within seconds."""
    client_ca_key, client_ca = certs.make_ca("api-server clients")
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(certs.cert_pem(client_ca))
    key, cert = certs.make_client_cert(client_ca_key, client_ca, "kube-apiserver")
    (tmp_path / "client.key").write_bytes(certs.key_pem(key))
    (tmp_path / "client.crt").write_bytes(certs.cert_pem(cert))
    other_key, other_ca = certs.make_ca("someone else")
    bad_key, bad_cert = certs.make_client_cert(other_key, other_ca, "intruder")
    (tmp_path / "bad.key").write_bytes(certs.key_pem(bad_key))
    (tmp_path / "bad.crt").write_bytes(certs.cert_pem(bad_cert))

    srv = start(tmp_path / "certs", "--client-ca", str(ca_file), wait=False)
    try:
        deadline = time.monotonic() + scaled(30)
        while not (tmp_path / "certs" / "ca.crt").exists():
            assert time.monotonic() < deadline and srv.proc.poll() is None, srv.output()
            time.sleep(0.05)
        base = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        good = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        good.load_cert_chain(str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
        while True:  # until the server is up (it only answers authenticated clients)
            try:
                with tls(srv, good) as sock:
                    sock.sendall(raw_request())
                    status, _ = read_response(sock)
                break
            except (OSError, ssl.SSLError):
                assert time.monotonic() < deadline and srv.proc.poll() is None, srv.output()
                time.sleep(0.1)
        assert status == 200
        intruder = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        intruder.load_cert_chain(str(tmp_path / "bad.crt"), str(tmp_path / "bad.key"))
        for context in (base, intruder):
            assert not answered(srv, context)
        # The bundle changes (the API server's client certificate now comes from the other
        # CA): new workers take it, and the callers swap places within seconds.
        certs.write_public(ca_file, certs.cert_pem(other_ca))
        deadline = time.monotonic() + scaled(20)
        while answered(srv, good) or not answered(srv, intruder):
            assert time.monotonic() < deadline, srv.output()[-2000:]
            time.sleep(0.2)
        assert not answered(srv, base)
    finally:
        stop(srv)


def answered(srv, context) -> bool:
    try:
        with tls(srv, context) as sock:
            sock.sendall(raw_request())
            return read_response(sock)[0] == 200
    except (ssl.SSLError, ConnectionError, OSError):
        return False


def test_missing_client_ca_is_refused_at_start(tmp_path):
    from testkit.servers import run_serve

    result = run_serve(tmp_path / "certs", "--client-ca", str(tmp_path / "nope.crt"))
    assert result.returncode == 2 and "client CA bundle" in result.stderr


class Load(Threads):
    """Client threads sending reviews in a loop; each result is recorded with the time
    its request was fully sent."""

    def __init__(self, server, threads: int = 4):
        self.server = server
        self.stop = threading.Event()
        self.results: list[tuple[float, bool]] = []
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]

    def run(self) -> None:
        sock = None
        while not self.stop.is_set():
            sent_at = None
            try:
                if sock is None:
                    sock = tls(self.server, timeout=scaled(2))
                sock.sendall(raw_request())
                sent_at = time.monotonic()
                status, _ = read_response(sock)
                self.results.append((sent_at, status == 200))
            except (OSError, ValueError, StopIteration):
                if sent_at is not None:
                    self.results.append((sent_at, False))
                if sock is not None:
                    sock.close()
                sock = None
                time.sleep(0.01)
        if sock is not None:
            sock.close()


def test_a_killed_worker_loses_only_its_in_flight_requests(tmp_path):
    """SIGKILL one of two workers under load: the other keeps answering, the supervisor
    starts a replacement (on the same listening socket, so no waiting connection is
    lost), and the only failures are requests the killed process was holding (at most
    one per client connection it served). The API server applies failurePolicy to
    those: the mutating webhook's Ignore admits the object unchanged, the validating
    webhook's Fail returns an error the client retries."""
    srv = start(tmp_path / "certs", workers=2)
    try:
        before = worker_pids(srv.proc.pid)
        assert len(before) == 2
        with Load(srv, threads=4) as load:
            eventually(lambda: sum(ok for _, ok in load.results) > 20)  # both serving
            victim = min(before)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            eventually(lambda: victim not in worker_pids(srv.proc.pid))
            eventually(lambda: sum(ok for t, ok in load.results if t > killed_at) > 20)
        # replaced (the survivor may answer its 20 before the replacement is up)
        eventually(lambda: len(worker_pids(srv.proc.pid) - {victim}) == 2)
        failures = [t for t, ok in load.results if not ok]
        late = [t for t in failures if t > killed_at + scaled(0.5)]
        assert len(failures) <= 4, failures  # at most the connections the victim held
        assert late == []  # nothing fails once the kill has happened
        assert sum(ok for _, ok in load.results if _ > killed_at) > 20  # still serving
    finally:
        stop(srv)


def test_sigterm_under_load_completes_in_flight_requests(tmp_path):
    """SIGTERM (a rolling update): every request sent before it is answered, including one
    whose body was still arriving when the signal came; the server then exits cleanly.
    (Connections opened after SIGTERM wait in the listen backlog until the process exits:
    in a cluster the endpoint is removed first, so none are opened.)"""
    srv = start(tmp_path / "certs", workers=2)
    request = raw_request()
    half = request[: len(request) // 2]
    with tls(srv) as slow:
        slow.sendall(half)
        with Load(srv, threads=4) as load:
            eventually(lambda: sum(ok for _, ok in load.results) > 10)
            srv.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            eventually(lambda: "stopping: finishing" in srv.output())  # the workers told
            slow.sendall(request[len(half) :])
            status, body = read_response(slow)
    assert status == 200 and json.loads(body)["response"]["allowed"] is True
    before = [ok for sent, ok in load.results if sent < signalled]
    assert len(before) > 10 and all(before)
    assert srv.proc.wait(scaled(30)) == 0


def test_no_eval_or_unsafe_yaml_in_the_code():
    """No code path evaluates input: no eval/exec, no unsafe YAML loaders, no pickle."""
    root = ROOT / "webhook"
    for path in root.rglob("*.py"):
        text = path.read_text()
        for banned in (
            "eval(",
            "exec(",
            "yaml.load(",
            "yaml.unsafe_load",
            "pickle",
            "Loader=yaml.Loader",
        ):
            assert banned not in text, f"{banned} in {path}"


def test_a_worker_that_cannot_start_fails_the_start_clearly(tmp_path):
    """--kube incluster outside a cluster: each worker fails while loading (the attempt
    cache has no in-cluster config); the server does not keep restarting them, it exits
    1 saying so, and the worker's own error is in the log."""
    from testkit.servers import run_serve

    result = run_serve(tmp_path / "certs", "--kube", "incluster")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "failed to start" in result.stderr and "see the log above" in result.stderr
    assert "worker failed" in result.stderr  # the worker's own line, with its traceback


def test_workers_do_not_outlive_their_supervisor(tmp_path):
    """SIGKILL of the supervisor (an OOM kill, say): its workers notice within seconds
    and stop, so no orphan keeps the port."""
    srv = start(tmp_path / "certs", workers=2)
    workers = worker_pids(srv.proc.pid)
    assert len(workers) == 2
    srv.proc.kill()
    srv.proc.wait(scaled(10))
    deadline = time.monotonic() + scaled(15)
    while any(os.path.exists(f"/proc/{pid}") for pid in workers):
        assert time.monotonic() < deadline, "workers still running without their supervisor"
        time.sleep(0.2)
