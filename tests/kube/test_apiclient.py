"""The words a person reads when the API server does not answer (``webhook/kube/apiclient``):
each failure made for real, with the real ``kubernetes`` client over real sockets, and
said as kubectl would say it (what failed, where), not as urllib3's repr of a connection."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kubernetes import client

from testkit.servers import free_port
from webhook.kube.apiclient import describe


def _ask(url: str, timeout: float = 5.0) -> Exception:
    configuration = client.Configuration()
    configuration.host = url
    configuration.verify_ssl = True
    configuration.retries = 0
    api = client.BatchV1Api(client.ApiClient(configuration))
    with pytest.raises(Exception) as caught:
        api.read_namespaced_job("train", "ml", _request_timeout=timeout)
    return caught.value


@contextmanager
def _listener(behaviour: str) -> Iterator[int]:
    """A local port that accepts and then closes at once (``drop``), answers in plain
    HTTP (``plain``) or says nothing (``silent``)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            if behaviour == "drop":
                conn.recv(65536)
                conn.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                conn.close()
            elif behaviour == "plain":  # a plain HTTP server's answer to a TLS hello
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


def test_a_closed_port_is_connection_refused_where_it_was_asked():
    port = free_port()
    status, words = describe(_ask(f"http://127.0.0.1:{port}"))
    assert status is None
    assert words == f"the API server did not answer (connection refused at http://127.0.0.1:{port})"


def test_a_server_that_says_nothing_is_a_timeout():
    with _listener("silent") as port:
        _, words = describe(_ask(f"http://127.0.0.1:{port}", timeout=0.5))
    assert words == (
        f"the API server did not answer (timed out waiting for an answer at "
        f"http://127.0.0.1:{port})"
    )


def test_a_connection_dropped_mid_request_says_so():
    with _listener("drop") as port:
        _, words = describe(_ask(f"http://127.0.0.1:{port}"))
    assert words == (
        f"the API server did not answer (the connection was dropped at http://127.0.0.1:{port})"
    )


def test_tls_spoken_to_a_plain_listener_says_tls_failed():
    with _listener("plain") as port:
        _, words = describe(_ask(f"https://127.0.0.1:{port}"))
    assert words.startswith(
        f"the API server did not answer (TLS failed at https://127.0.0.1:{port}"
    )


def test_an_http_error_keeps_the_status_words():
    err = client.ApiException(status=403, reason="Forbidden")
    err.body = b'{"kind":"Status","message":"jobs.batch \\"train\\" is forbidden"}'
    assert describe(err) == (403, 'HTTP 403 forbidden: jobs.batch "train" is forbidden')
