"""Slow and idle clients held against a server while normal reviews are timed.

The attack (``Attack``), as the issue sets it: 2,000 TCP connections that never start
their TLS handshake, 500 TLS connections trickling a request's headers (a byte at a
time, never ending them) and 200 trickling a request's body (headers sent, the body a
byte at a time). Meanwhile normal reviews are sent (``normal_reviews``) the way the API
server sends them: over a few kept-alive connections, plus some on new connections;
each one's time is recorded, and a review not answered within its timeout counts as
failed. Then the attackers leave, and normal reviews are timed again.

``python -m benchmarks.slowclients`` runs it against the webhook served as deployed and
against the gunicorn floor (``benchmarks.floor``), and prints JSON; ``benchmarks.run``
puts it in the report. tests/serving/test_slowclients.py holds the server to it (every review
answered, none lost), without timing targets.
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import ssl
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.cases import streams

#: A normal review: an annotated Job, as the API server sends it.
BODY = streams(1)["job-annotated"][0]


def request_bytes(body: bytes = BODY) -> bytes:
    return (
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def raise_file_limit(wanted: int) -> int:
    """The soft open-file limit raised towards ``wanted`` (within the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def read_response(sock: ssl.SSLSocket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response headers")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        rest += chunk
    return status, rest[:length]


class Attack:
    """The slow and idle clients, held open (with a thread trickling bytes) while in use.

    ``attached()`` says how many of each kind the server still holds open."""

    def __init__(
        self,
        port: int,
        ca_file: Path,
        idle: int = 2000,
        headers: int = 500,
        bodies: int = 200,
        interval: float = 1.0,
        host: str = "127.0.0.1",
        open_timeout: float = 3.0,
        open_budget: float = 60.0,
    ):
        self.address = (host, port)
        #: A server that cannot take them up (gunicorn, once its threads are held) would
        #: make each open wait: each is given ``open_timeout``, all of them
        #: ``open_budget`` seconds; the rest count as ``failed_to_open``.
        self.open_timeout = open_timeout
        self.open_budget = open_budget
        self._open_by = 0.0
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.counts = {"idle": idle, "headers": headers, "bodies": bodies}
        self.interval = interval
        self.idle: list[socket.socket] = []
        self.headers: list[ssl.SSLSocket] = []
        self.bodies: list[ssl.SSLSocket] = []
        self.failed_to_open = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tls(self) -> ssl.SSLSocket | None:
        if time.monotonic() > self._open_by:
            self.failed_to_open += 1
            return None
        try:
            raw = socket.create_connection(self.address, timeout=self.open_timeout)
            sock = self.context.wrap_socket(raw, server_hostname="localhost")
            sock.settimeout(15)
            return sock
        except OSError:
            self.failed_to_open += 1
            return None

    def _header_trickler(self) -> ssl.SSLSocket | None:
        sock = self._tls()
        if sock is not None:
            # A request line and the start of a header that never ends.
            sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nX-Slow: a")
        return sock

    def _body_trickler(self) -> ssl.SSLSocket | None:
        sock = self._tls()
        if sock is not None:
            head = request_bytes()[: -len(BODY)]
            sock.sendall(head + BODY[:16])  # then a byte at a time
        return sock

    def __enter__(self) -> Attack:
        self._open_by = time.monotonic() + self.open_budget
        with ThreadPoolExecutor(8) as pool:
            headers = pool.map(lambda _: self._header_trickler(), range(self.counts["headers"]))
            self.headers = [sock for sock in headers if sock is not None]
            bodies = pool.map(lambda _: self._body_trickler(), range(self.counts["bodies"]))
            self.bodies = [sock for sock in bodies if sock is not None]
        self._thread = threading.Thread(target=self._trickle, name="trickle", daemon=True)
        self._thread.start()
        # Last: the server closes a connection that has not finished its TLS handshake
        # after 10 s, and the measurement must fall within that.
        for _ in range(self.counts["idle"]):
            try:
                self.idle.append(socket.create_connection(self.address, timeout=self.open_timeout))
            except OSError:
                self.failed_to_open += 1
        return self

    def _trickle(self) -> None:
        """One byte to every trickler each ``interval`` seconds, spread over it."""
        sockets: list[tuple[ssl.SSLSocket, bytes]] = [(s, b"a") for s in self.headers]
        sockets += [(s, b" ") for s in self.bodies]  # JSON whitespace: a body never done
        dead: set[int] = set()
        while not self._stop.is_set():
            started = time.monotonic()
            for index, (sock, byte) in enumerate(sockets):
                if index in dead:
                    continue
                try:
                    sock.sendall(byte)
                except OSError:
                    dead.add(index)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def attached(self) -> dict[str, int]:
        """How many of each kind the server has not closed (a closed one reads EOF)."""

        def open_count(socks: list[Any]) -> int:
            alive = 0
            for sock in socks:
                try:
                    sock.setblocking(False)
                    try:
                        alive += sock.recv(1) != b""  # data (an answer) is not expected
                    except (BlockingIOError, ssl.SSLWantReadError):
                        alive += 1
                    finally:
                        sock.setblocking(True)
                except OSError:
                    pass
            return alive

        return {
            "idle": open_count(self.idle),
            "headers": open_count(self.headers),
            "bodies": open_count(self.bodies),
        }

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for sock in [*self.idle, *self.headers, *self.bodies]:
            with contextlib.suppress(OSError):
                sock.close()


def normal_reviews(
    port: int,
    ca_file: Path,
    count: int = 200,
    rate: float = 50.0,
    keepalive: int = 4,
    fresh_every: int = 10,
    timeout: float = 5.0,
    host: str = "127.0.0.1",
) -> dict[str, Any]:
    """``count`` reviews at about ``rate`` a second: over ``keepalive`` kept-alive
    connections (the API server's pool), every ``fresh_every``-th on a new connection
    (its handshake included in its time). Latencies of the answered ones, in ms."""
    context = ssl.create_default_context(cafile=str(ca_file))
    lock = threading.Lock()
    latencies: list[float] = []
    failures: list[str] = []
    request = request_bytes()

    def connect() -> ssl.SSLSocket:
        raw = socket.create_connection((host, port), timeout=timeout)
        return context.wrap_socket(raw, server_hostname="localhost")

    def one(sock: ssl.SSLSocket | None) -> ssl.SSLSocket | None:
        started = time.monotonic()
        fresh = sock is None
        try:
            if sock is None:
                sock = connect()
            sock.settimeout(timeout)
            sock.sendall(request)
            status, _ = read_response(sock)
            if status != 200:
                raise ConnectionError(f"HTTP {status}")
            with lock:
                latencies.append((time.monotonic() - started) * 1000)
            if fresh:
                sock.close()
                return None
            return sock
        except (OSError, ValueError, StopIteration) as err:
            with lock:
                failures.append(f"{type(err).__name__}: {err}")
            if sock is not None:
                sock.close()
            return None

    def sender(index: int, share: int) -> None:
        sock = None
        step = keepalive / rate
        next_at = time.monotonic() + index * step / keepalive
        for n in range(share):
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += step
            if (n * keepalive + index) % fresh_every == fresh_every - 1:
                one(None)
            else:
                sock = one(sock)
        if sock is not None:
            sock.close()

    threads = [
        threading.Thread(target=sender, args=(i, count // keepalive)) for i in range(keepalive)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    ordered = sorted(latencies)

    def pick(q: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None

    return {
        "sent": len(latencies) + len(failures),
        "answered": len(latencies),
        "failed": len(failures),
        "failures": sorted(set(failures))[:5],
        "seconds": round(elapsed, 1),
        "p50_ms": pick(0.5),
        "p99_ms": pick(0.99),
        "max_ms": round(ordered[-1], 1) if ordered else None,
        "mean_ms": round(statistics.mean(ordered), 1) if ordered else None,
    }


def established(port: int) -> int:
    """Established TCP connections to ``port`` (IPv4), from the kernel's table."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if row[2].endswith(f":{port:04X}") and row[3] == "01")


def under_attack(
    port: int,
    ca_file: Path,
    count: int = 200,
    rate: float = 50.0,
    timeout: float = 5.0,
    **attack: Any,
) -> dict[str, Any]:
    """Normal reviews before, during and after the attack."""
    raise_file_limit(16384)
    result: dict[str, Any] = {"before": normal_reviews(port, ca_file, 40, rate, timeout=timeout)}
    result["attack_size"] = {
        k: attack.get(k, v) for k, v in (("idle", 2000), ("headers", 500), ("bodies", 200))
    }
    with Attack(port, ca_file, **attack) as held:
        result["attack"] = {
            "opened": {k: len(getattr(held, k)) for k in ("idle", "headers", "bodies")},
            "failed_to_open": held.failed_to_open,
            "established_server_side": established(port),
        }
        result["during"] = normal_reviews(port, ca_file, count, rate, timeout=timeout)
        result["attack"]["still_attached_after"] = held.attached()
    time.sleep(0.5)
    result["after"] = normal_reviews(port, ca_file, 40, rate, timeout=timeout)
    return result


def run() -> dict[str, Any]:
    """The attack against the webhook (served as deployed), and a small part of it
    against the gunicorn floor."""
    import tempfile

    from benchmarks.https import Served
    from webhook.tls import certs

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = Path(tmp) / "certs"
        certs.generate(cert_dir, extra_dns=["localhost"])
        served = Served("webhook", cert_dir, 2, 8)
        try:
            results["webhook"] = under_attack(served.port, cert_dir / "ca.crt")
        finally:
            served.stop()
        # The contrast: 40 header tricklers hold gunicorn's 2 x 8 threads (and every
        # review after them waits for its 2 s timeout, so only 40 are sent).
        served = Served("gunicorn", cert_dir, 2, 8)
        try:
            results["gunicorn"] = under_attack(
                served.port,
                cert_dir / "ca.crt",
                count=40,
                timeout=2.0,
                headers=40,
                bodies=0,
                open_budget=20.0,
            )
        finally:
            served.stop()
    return results


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
