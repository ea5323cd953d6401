"""Slow, idle and too many clients against the real server (``retry-webhook serve``), and
what each of its limits does: the header and body timeouts, the bound on connections per
worker, HTTP/1.1 only, and a request that waits on the Kubernetes API without holding up
the others. The attack of the issue is run in full (benchmarks/slowclients.py: thousands
of connections); the p99 it gives is a benchmark figure, not asserted here."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import uuid

import pytest

from benchmarks import slowclients
from benchmarks.slowclients import raise_file_limit, read_response, request_bytes
from testkit.builders import FULL, job, job_owner, pod, review
from testkit.fakeapi import FakeAPI, write_kubeconfig
from testkit.servers import eventually, scaled, start, stop


def tls(server, timeout: float = 10, context: ssl.SSLContext | None = None) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return (context or server.context).wrap_socket(raw, server_hostname="localhost")


def closed_by_server(sock: ssl.SSLSocket, within: float) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def test_thousands_of_slow_and_idle_clients_do_not_delay_admission(tmp_path):
    """2,000 TCP connections that never start TLS, 500 TLS connections trickling headers
    and 200 trickling a body, all held while 200 normal reviews are sent (over kept-alive
    connections and new ones, at 50 a second): every one is answered, and so are those
    after the attackers leave. (Under gunicorn, 32 such clients stopped every review.)"""
    if raise_file_limit(16384) < 6000:
        pytest.skip("the open-file limit cannot be raised to hold 2,700 connections")
    # The longest timeouts: the tricklers must stay for the whole measurement even on a
    # slow machine (the timeouts themselves are tested below).
    srv = start(tmp_path / "certs", "--read-timeout", "60", workers=2)
    try:
        result = slowclients.under_attack(srv.port, tmp_path / "certs" / "ca.crt", count=200)
    finally:
        stop(srv)
    attack, during = result["attack"], result["during"]
    assert attack["opened"] == {"idle": 2000, "headers": 500, "bodies": 200}, attack
    assert attack["established_server_side"] >= 2700  # really held, server side
    # Still held when the normal reviews were done: the server did not shed them.
    assert attack["still_attached_after"] == attack["opened"], attack
    assert during["answered"] == during["sent"] == 200, during
    assert result["before"]["failed"] == result["after"]["failed"] == 0, result
    assert result["after"]["answered"] == 40


def test_headers_that_do_not_arrive_in_time_close_the_connection(tmp_path):
    """--header-timeout: a request whose headers are not complete in time, and a
    kept-alive connection idle that long, are closed; a connection still sending its
    headers is not closed before then."""
    srv = start(tmp_path / "certs", "--header-timeout", "1", workers=1)
    try:
        partial = tls(srv)
        partial.sendall(request_bytes()[:40])  # half a request line, then silence
        idle = tls(srv)
        idle.sendall(request_bytes())
        assert read_response(idle)[0] == 200  # answered, then idle
        assert closed_by_server(partial, scaled(6)) and closed_by_server(idle, scaled(6))
        # A client that keeps sending, but never finishes its headers, is closed too:
        # the limit is on the headers' arrival, not on silence.
        trickling = tls(srv)
        trickling.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < scaled(6) and not closed:
            try:
                trickling.sendall(b"a")
            except OSError:
                closed = True
            closed = closed or closed_by_server(trickling, 0.2)
        assert closed
        assert [one_review(srv) for _ in range(3)] == [200] * 3
    finally:
        stop(srv)


def one_review(srv) -> int:
    with tls(srv) as sock:
        sock.sendall(request_bytes())
        return read_response(sock)[0]


def test_a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes(tmp_path):
    srv = start(tmp_path / "certs", "--body-timeout", "1", workers=1)
    try:
        sock = tls(srv)
        request = request_bytes()
        sock.sendall(request[: len(request) - 100])  # all but the last 100 bytes
        sock.settimeout(10)
        status, body = read_response(sock)
        assert status == 408
        assert json.loads(body) == {
            "error": "RequestTimeout",
            "reason": "request body not received",
        }
        assert closed_by_server(sock, 5)
        assert one_review(srv) == 200
    finally:
        stop(srv)


def test_at_the_connection_bound_new_connections_wait_and_existing_ones_are_served(tmp_path):
    """--max-connections per worker: at the bound a new connection is not taken up (it
    waits in the kernel's queue, its TLS handshake not started) until one of the held
    ones closes, here by the header timeout of an idle kept-alive one; the connections
    the worker holds are served meanwhile."""
    srv = start(tmp_path / "certs", "--max-connections", "4", "--header-timeout", "3", workers=1)
    try:
        held = [tls(srv) for _ in range(4)]
        for sock in held:
            sock.sendall(request_bytes())
            assert read_response(sock)[0] == 200
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(10))
        waiting = srv.context.wrap_socket(
            raw, server_hostname="localhost", do_handshake_on_connect=False
        )
        waiting.settimeout(1.0)
        with pytest.raises((TimeoutError, ssl.SSLError)):
            waiting.do_handshake()  # not taken up: the worker is at its bound
        held[0].sendall(request_bytes())  # a held connection is served at the bound
        assert read_response(held[0])[0] == 200
        # The others go idle; the header timeout closes them, freeing slots.
        waiting.settimeout(15)
        waiting.do_handshake()
        waiting.sendall(request_bytes())
        assert read_response(waiting)[0] == 200
    finally:
        stop(srv)


def test_http2_is_not_offered_and_not_spoken(tmp_path):
    """HTTP/1.1 only (docs/OPERATIONS.md, "HTTP/2"): ALPN never selects h2, and a client that
    starts HTTP/2 anyway (the connection preface) gets no HTTP/2 frame back."""
    srv = start(tmp_path / "certs", workers=1)
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        context.set_alpn_protocols(["h2", "http/1.1"])
        with tls(srv, context=context) as sock:
            assert sock.selected_alpn_protocol() == "http/1.1"
            sock.sendall(request_bytes())
            assert read_response(sock)[0] == 200
        h2_only = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        h2_only.set_alpn_protocols(["h2"])
        with pytest.raises(ssl.SSLError, match=r"NO_APPLICATION_PROTOCOL|no application protocol"):
            tls(srv, context=h2_only)  # a client that will only speak h2 is refused
        with tls(srv) as sock:  # no ALPN, and HTTP/2 "with prior knowledge"
            preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
            sock.sendall(preface + settings)
            sock.settimeout(5)
            try:
                reply = sock.recv(4096)
            except (ConnectionResetError, ssl.SSLError):
                reply = b""
        assert reply == b"" or reply.startswith(b"HTTP/1.1 "), reply[:40]
    finally:
        stop(srv)


def test_a_request_waiting_on_the_api_does_not_hold_up_the_others(tmp_path):
    """A pod whose Job is not in the attempt cache costs one GET to the API; here the API
    takes 3 s to answer. One worker: the reviews sent meanwhile are answered while that
    one still waits (it waits on a thread, not on the worker's event loop), and it is
    answered too, once the GET gives up (--lookup-timeout)."""
    api = FakeAPI().start()
    api.get_delay = 3.0
    write_kubeconfig(tmp_path / "kubeconfig", api.url)
    srv = start(
        tmp_path / "certs",
        "--kube",
        "kubeconfig",
        "--lookup-timeout",
        "2",
        workers=1,
        env={"KUBECONFIG": str(tmp_path / "kubeconfig")},
    )
    try:
        annotations = {
            "retry-policy.dev/backoff-limit": "3",
            "retry-policy.dev/non-spot-attempts": "1",
        }
        unknown = pod(annotations, owner=job_owner("new-job", str(uuid.uuid4())))
        waiting: dict = {}

        def send() -> None:
            waiting["answer"] = srv.review("/mutate", review(unknown))["response"]
            waiting["at"] = time.monotonic()

        thread = threading.Thread(target=send)
        thread.start()
        eventually(lambda: any("/namespaces/ml/jobs/new-job" in p for p, _ in api.requests))
        others = []
        for _ in range(10):
            answer = srv.review("/mutate", review(job(FULL)))["response"]
            others.append((time.monotonic(), answer["allowed"]))
        assert thread.is_alive()  # the first is still waiting on the API...
        thread.join(scaled(15))
        assert all(ok for _, ok in others)
        assert all(at < waiting["at"] for at, _ in others)  # ...and all 10 came first
        assert any("attempt number unknown" in w for w in waiting["answer"]["warnings"])
    finally:
        stop(srv)
        api.stop()


def test_the_open_file_limit_is_raised_for_the_connections(tmp_path):
    """A shell's soft limit of 1,024 open files would cap connections long before
    --max-connections: the server raises its own (within the hard limit)."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("the hard open-file limit is too low to tell")

    def shell_like() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    srv = start(tmp_path / "certs", workers=1, preexec_fn=shell_like)
    try:
        with open(f"/proc/{srv.proc.pid}/limits") as limits:
            line = next(row for row in limits if row.startswith("Max open files"))
        assert int(line.split()[3]) > 1024, line
    finally:
        stop(srv)


def test_a_connection_that_never_starts_its_tls_handshake_is_closed(tmp_path):
    """A TCP connection that sends nothing holds no connection slot (its handshake has not
    finished) and is closed when the handshake's time limit (10 s, granian's) is up."""
    srv = start(tmp_path / "certs", "--max-connections", "1", workers=1)
    try:
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(5)]
        assert one_review(srv) == 200  # the one slot is free: the idle ones hold none
        started = time.monotonic()
        for sock in idle:
            sock.settimeout(scaled(20))
            assert sock.recv(1) == b""
        assert time.monotonic() - started < scaled(15)
    finally:
        stop(srv)
