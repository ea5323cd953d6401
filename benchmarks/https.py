"""Over HTTPS: the real server (``retry-webhook serve``: granian workers, TLS, production
settings) under load from real load generators, against two floors in the same run
(``benchmarks.floor``): the allow-all app served exactly like the webhook, and the same
app under gunicorn gthread as a user would hand-write it.

- saturated: ``wrk`` with keep-alive connections, the floors and the webhook in turn,
  round after round (``solo_rounds`` and ``ratios`` say why);
- fixed rate: 500 requests/s offered by ten independent ``hey`` senders (``paced`` says
  why not one), p50 and p99 from every request's time but each connection's first;
- scaling: the same saturated run with one worker process and with two (the closest this
  2-core machine gets to "a second replica").

Request bodies are real AdmissionReviews (benchmarks/cases.py), posted as streams of
distinct objects (every Job new; the pods of one Job; every pod from a different Job).
"""

from __future__ import annotations

import atexit
import csv
import io
import json
import os
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.cases import streams
from webhook.tls import certs

ROOT = Path(__file__).resolve().parent.parent

#: wrk posts the stream's bodies in turn (one per line of BODY_FILE), so distinct objects
#: reach the server as they would from a cluster.
LUA = """
local bodies = {}
for line in io.lines(os.getenv("BODY_FILE")) do
  bodies[#bodies + 1] = line
end
local headers = {["Content-Type"] = "application/json"}
local next_body = 0
request = function()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", nil, headers, bodies[next_body])
end
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(port: int, ca: Path, path: str, timeout: float) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(
        f"https://localhost:{port}{path}", context=context, timeout=timeout
    ) as answer:
        return answer.read()


#: How long a server may take to start (the tests make it longer on a busy machine).
START_SECONDS = 30.0


def _wait_healthy(port: int, ca: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            _get(port, ca, "/healthz", 2)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server not healthy")


def server_command(
    which: str, cert_dir: Path, port: int, workers: int, threads: int, extra: tuple[str, ...] = ()
) -> list[str]:
    """How a benchmark starts a server on ``port``: ``webhook`` (production settings: a
    log line per decision, metrics on), ``floor`` (the allow-all app on our server, served
    like the webhook), ``gunicorn`` (the allow-all app under gunicorn gthread, as a user
    would hand-write it) or ``granian-wsgi`` (the same, under granian's WSGI interface)."""
    bin_dir = Path(sys.executable).parent
    cert, key = str(cert_dir / "tls.crt"), str(cert_dir / "tls.key")
    if which == "gunicorn":
        return [
            str(bin_dir / "gunicorn"),
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--bind",
            f"127.0.0.1:{port}",
            "--certfile",
            cert,
            "--keyfile",
            key,
            "--log-level",
            "warning",
            "benchmarks.floor:app",
        ]
    if which == "granian-wsgi":
        return [
            str(bin_dir / "granian"),
            "--interface",
            "wsgi",
            "--workers",
            str(workers),
            "--blocking-threads",
            str(threads),
            "--http",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--ssl-certificate",
            cert,
            "--ssl-keyfile",
            key,
            "--ssl-protocol-min",
            "tls1.2",
            "--log-level",
            "warning",
            "benchmarks.floor:app",
        ]
    sizing = ["--workers", str(workers), "--threads", str(threads), "--cert-dir", str(cert_dir)]
    if which == "floor":
        return [sys.executable, "-m", "benchmarks.floor", "--port", str(port), *sizing]
    return [
        str(bin_dir / "retry-webhook"),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kube",
        "off",
        "--log-level",
        "info",
        "--metrics-port",
        str(_free_port()),
        *sizing,
        *extra,
    ]


class Served:
    """A server process (the webhook or a floor) on a free port."""

    def __init__(
        self,
        which: str,
        cert_dir: Path,
        workers: int,
        threads: int,
        extra: tuple[str, ...] = (),
        log: Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.which = which
        self.port = _free_port()
        self.cmd = server_command(which, cert_dir, self.port, workers, threads, extra)
        out = open(log, "w") if log else subprocess.DEVNULL  # the child keeps its copy
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
                cwd=ROOT,  # benchmarks.floor:app, for the servers started on a module path
                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
            )
        finally:
            if log:
                out.close()
        try:
            _wait_healthy(self.port, cert_dir / "ca.crt", self.proc)
        except BaseException:
            self.stop()
            raise

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the server and its worker processes so far."""
        return sum(map(cpu_seconds, [self.proc.pid, *_children(self.proc.pid)]))

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}/mutate"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of one process so far; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split()]


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


_SCRIPT: list[str] = []


def _script() -> str:
    """The Lua script that makes wrk post the body: written once, removed at exit."""
    if not _SCRIPT:
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
            script.write(LUA)
        _SCRIPT.append(script.name)
        atexit.register(os.unlink, script.name)
    return _SCRIPT[0]


def _start_wrk(url: str, body_file: Path, seconds: int, connections: int) -> subprocess.Popen:
    """``wrk`` posting ``body_file`` over ``connections`` kept-alive connections."""
    command = ["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds}s", "--latency"]
    return subprocess.Popen(
        [*command, "-s", _script(), url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "BODY_FILE": str(body_file)},
    )


def wrk(url: str, body_file: Path, seconds: int, connections: int) -> dict:
    run = _start_wrk(url, body_file, seconds, connections)
    out = run.communicate()[0]
    if run.returncode:
        raise RuntimeError(f"wrk failed: {out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    latency = {p: _ms(v) for p, v in re.findall(r"^\s+(50|90|99)%\s+(\S+)", out, re.M)}
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": round(rps, 1),
        "requests": total,
        "p50_ms": latency.get("50"),
        "p90_ms": latency.get("90"),
        "p99_ms": latency.get("99"),
        "non_2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1) if socket_errors else "",
    }


def paced(
    url: str,
    body_file: Path,
    seconds: int,
    rate: int,
    senders: int = 10,
    server: Served | None = None,
) -> dict:
    """``rate`` requests a second from ``senders`` independent clients: one ``hey``
    process each, with one kept-alive connection and ``rate / senders`` requests a second,
    started at spread-out moments.

    ``hey -c N -q R`` is not a rate: its N workers start together, each with its own ticker,
    so they fire in step, a burst of N requests every 1/R s. Against the floor at 500/s in
    bursts of 10 (``-c 10 -q 50``), the median was 3.6-6 ms; from ten unsynchronised
    senders, 1.1-1.4 ms. The API server's requests come from independent clients. Each
    sender's first request also carries its TLS handshake, which the API server pays once
    per connection it keeps open: those are reported apart (``handshake_ms``), not in the
    percentiles. A sender waits for each answer before its next request, so a stall skips
    that sender's ticks meanwhile; the other senders keep the rate up.
    """
    procs = []
    cpu_before = server.cpu_seconds() if server is not None else 0.0
    for _ in range(senders):
        procs.append(
            subprocess.Popen(
                [
                    "hey",
                    "-z",
                    f"{seconds}s",
                    "-c",
                    "1",
                    "-q",
                    str(rate / senders),
                    "-m",
                    "POST",
                    "-T",
                    "application/json",
                    "-D",
                    str(body_file),
                    # hey sends its Host header as the TLS server name, port included by
                    # default, which is not a host name: rustls (granian) refuses it.
                    "-host",
                    "localhost",
                    "-o",
                    "csv",
                    url,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
        time.sleep(1 / rate)  # the next sender's ticks fall between this one's
    outputs = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"hey exited with {proc.returncode}")
        outputs.append(out)
    report = fixed_rate_report(outputs, seconds, rate)
    if report["achieved_rps"] < rate / 2:  # hey lists only answered requests
        raise RuntimeError(f"hey: most requests to {url} failed: {report}")
    if server is not None:
        # Cores the server used to serve this rate: what a pod's CPU request is sized on.
        report["cpu_cores"] = round((server.cpu_seconds() - cpu_before) / seconds, 3)
    return report


def paced_rounds(
    servers: dict[str, Served], body_file: Path, rounds: int = 3, seconds: int = 8, rate: int = 500
) -> dict[str, dict]:
    """``paced`` for each server in turn, ``rounds`` times: per server, the median round
    (by p50, p99 and cores each) and every round. One 10-second run of a server meets
    whatever else the shared machine does meanwhile: a neighbour's burst put a single
    run's p99 at 15-70 ms where the rounds around it had 2-4 ms."""
    seen: dict[str, list[dict]] = {name: [] for name in servers}
    for _ in range(rounds):
        for name, server in servers.items():
            seen[name].append(paced(server.url, body_file, seconds, rate, server=server))
    result = {}
    for name, reports in seen.items():

        def middle(key: str, values: list[dict] = reports) -> float:
            return statistics.median(r[key] for r in values)

        result[name] = {
            "offered_rps": rate,
            "achieved_rps": min(r["achieved_rps"] for r in reports),
            "senders": reports[0]["senders"],
            "p50_ms": middle("p50_ms"),
            "p99_ms": middle("p99_ms"),
            "cpu_cores": middle("cpu_cores"),
            "handshake_ms": middle("handshake_ms"),
            "errors": sum(r["errors"] for r in reports),
            "rounds": reports,
        }
    return result


def fixed_rate_report(outputs: list[str], seconds: int, rate: int) -> dict:
    """Percentiles of every sender's requests but its first (its connection's handshake)."""
    steady: list[float] = []
    handshakes: list[float] = []
    errors = 0
    for out in outputs:
        rows = sorted(csv.DictReader(io.StringIO(out)), key=lambda r: float(r["offset"]))
        errors += sum(1 for r in rows if r["status-code"] != "200")
        times = [float(r["response-time"]) * 1000 for r in rows]
        handshakes += times[:1]
        steady += times[1:]
    steady.sort()
    handshakes.sort()

    def pick(values: list[float], q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 2) if values else 0.0

    return {
        "offered_rps": rate,
        "achieved_rps": round((len(steady) + len(handshakes)) / seconds, 1),
        "senders": len(outputs),
        "p50_ms": pick(steady, 0.50),
        "p99_ms": pick(steady, 0.99),
        "handshake_ms": pick(handshakes, 0.50),
        "errors": errors,
    }


def solo_rounds(
    servers: dict[str, Served], body: Path, seconds: int, connections: int, rounds: int
) -> dict[str, dict]:
    """Saturate each server alone (it and ``wrk`` share the 2 cores, as the targets say),
    in turn, ``rounds`` times; per server, each round's throughput and CPU time a request
    (user + system, of the server's own processes), and the best of each.

    This machine's speed moves by up to 2x between 2-second rounds (larger swings seen
    earlier were mostly gunicorn's accept lottery, which ``reuse_port_gain`` measures): a
    single run of each server would compare moments, not servers. Short rounds that alternate
    between the servers let ``ratios`` compare each round with its neighbours, which
    mostly share its phase; the calibration pair (the floor against a second floor)
    shows how far apart two identical servers still come out. Running both servers at
    once was tried and dropped: two servers and two load generators on 2 cores
    oversubscribe them, which inflates context switches unevenly.
    """
    seen: dict[str, dict[str, list[float]]] = {name: {"rps": [], "cpu_us": []} for name in servers}
    order = list(servers.items())
    for index in range(rounds + 1):
        # ... A B A B ... A: every round of the second server has one of the first on each
        # side (``ratios``); the first server runs once more.
        for name, server in order if index < rounds else order[:1]:
            before = server.cpu_seconds()
            result = wrk(server.url, body, seconds, connections)
            used = server.cpu_seconds() - before
            seen[name]["rps"].append(result["rps"])
            seen[name]["cpu_us"].append(round(used / max(result["requests"], 1) * 1e6, 1))
    return {
        name: {
            "rps_rounds": values["rps"],
            "cpu_us_rounds": values["cpu_us"],
            "best_rps": max(values["rps"]),
            "best_cpu_us": min(values["cpu_us"]),
        }
        for name, values in seen.items()
    }


def ratios(rounds: dict[str, dict], base: str, other: str) -> dict:
    """``other`` relative to ``base``, so that 1.0 is "as fast as the floor".

    This VM's speed changes by up to 2x, sometimes from one 2-second round to the next: a
    round's throughput is the server's own speed times a factor the server does not
    choose. Over many alternating
    rounds both servers meet the same factors, so the ratio of the same upper quantile
    of each (``throughput``: the 75th percentile, mostly fast-phase rounds) estimates
    the ratio of their own speeds; the calibration pair shows what is left of the noise.
    Also recorded: ``paired`` (each round against its neighbours, median), and
    ``best_throughput`` (best round against best round); ``per_cpu`` is the quantile
    ratio of CPU time a request (the lower quartile, inverted).
    """
    a, b = rounds[base], rounds[other]

    def quantile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    paired = []
    for i, mine in enumerate(b["rps_rounds"]):
        around = a["rps_rounds"][i : i + 2]  # base ran just before this round and just after
        paired.append(mine / (sum(around) / len(around)))
    return {
        "throughput": round(quantile(b["rps_rounds"], 0.75) / quantile(a["rps_rounds"], 0.75), 3),
        "per_cpu": round(
            quantile(a["cpu_us_rounds"], 0.25) / quantile(b["cpu_us_rounds"], 0.25), 3
        ),
        "paired": round(statistics.median(paired), 3),
        "best_throughput": round(b["best_rps"] / a["best_rps"], 3),
    }


#: Cases over HTTPS (``benchmarks.cases.streams`` says what each stream is).
HTTPS_CASES = (
    "job-plain",
    "job-annotated",
    "job-annotated-distinct",
    "pod-last-attempt",
    "pod-last-attempt-new",
    "pod-last-attempt-distinct",
)
#: Streams whose every object needs the full policy run (no two views agree): their
#: fixed-rate run (``hey`` posts one body) is against a webhook with ``--memo-entries 0``,
#: so that each repeat of the body is computed in full too.
MISSES = ("job-annotated-distinct", "pod-last-attempt-distinct")


def run(
    seconds: int = 2,
    workers: int = 2,
    threads: int = 8,
    connections: int = 16,
    rounds: int = 16,
) -> dict:
    for tool in ("wrk", "hey"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install {tool}")
    if not (Path(sys.executable).parent / "gunicorn").exists():
        raise SystemExit("gunicorn not found: pip install -e '.[bench]' (make bench does)")
    cases = streams()
    settings = {
        "seconds": seconds,
        "workers": workers,
        "threads": threads,
        "connections": connections,
        "rounds": rounds,
        "bodies_per_stream": len(cases["job-annotated"]),
    }
    results: dict = {"settings": settings, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = Path(tmp) / "certs"
        certs.generate(cert_dir, extra_dns=["localhost"])

        def stream_file(name: str, bodies: list[bytes]) -> Path:
            path = Path(tmp) / f"{name}.jsonl"
            path.write_bytes(b"\n".join(bodies) + b"\n")
            return path

        def one_body(name: str, body: bytes) -> Path:
            path = Path(tmp) / f"{name}.json"
            path.write_bytes(body)
            return path

        gunicorn = Served("gunicorn", cert_dir, workers, threads)
        floor = Served("floor", cert_dir, workers, threads)
        webhook = Served("webhook", cert_dir, workers, threads)
        twin = Served("floor", cert_dir, workers, threads)
        granian = Served("granian-wsgi", cert_dir, workers, threads)
        no_memo = Served("webhook", cert_dir, workers, threads, ("--memo-entries", "0"))
        started = [gunicorn, floor, webhook, twin, granian, no_memo]
        # In turn, each round: the hand-written floor, our server's floor, the webhook.
        servers = {"gunicorn": gunicorn, "floor": floor, "webhook": webhook}
        try:
            calibration = stream_file("calibration", cases["job-plain"])
            for server in (floor, twin, granian):
                wrk(server.url, calibration, 2, connections)  # warm-up
            measured = solo_rounds(
                {"floor": floor, "twin": twin}, calibration, seconds, connections, rounds
            )
            results["calibration_floor_vs_floor"] = {
                "rounds": measured,
                **ratios(measured, "floor", "twin"),
            }
            # What our serving layer (supervisor, RSGI adapter) costs against granian's
            # own WSGI interface, on the same allow-all app.
            measured = solo_rounds(
                {"granian-wsgi": granian, "floor": floor}, calibration, seconds, connections, rounds
            )
            results["serving_layer"] = {
                "rounds": measured,
                **ratios(measured, "granian-wsgi", "floor"),
            }
            for name in HTTPS_CASES:
                bodies = stream_file(name, cases[name])
                single = one_body(name, cases[name][0])
                for server in servers.values():
                    wrk(server.url, bodies, 2, connections)  # warm-up
                measured = solo_rounds(servers, bodies, seconds, connections, rounds)
                entry: dict = {
                    "saturated": measured,
                    "vs_gunicorn": ratios(measured, "gunicorn", "webhook"),
                    "vs_floor": ratios(measured, "floor", "webhook"),
                }
                fixed_rate_webhook = no_memo if name in MISSES else webhook
                entry["fixed_500rps"] = paced_rounds(
                    {"gunicorn": gunicorn, "floor": floor, "webhook": fixed_rate_webhook}, single
                )
                results["cases"][name] = entry
        finally:
            for server in started:
                server.stop()
        body = stream_file("scale", cases["job-annotated-distinct"])
        one, two = Served("webhook", cert_dir, 1, threads), Served("webhook", cert_dir, 2, threads)
        try:
            measured = solo_rounds(
                {"1_worker": one, "2_workers": two}, body, seconds, connections, rounds
            )
        finally:
            one.stop()
            two.stop()
        results["scaling"] = {
            "rounds": measured,
            "1_worker": measured["1_worker"]["best_rps"],
            "2_worker": measured["2_workers"]["best_rps"],
            "ratio": ratios(measured, "1_worker", "2_workers")["throughput"],
        }
        results["reuse_port"] = reuse_port_gain(cert_dir, workers, threads, connections, body)
    return results


def reuse_port_gain(
    cert_dir: Path, workers: int, threads: int, connections: int, body: Path, rounds: int = 8
) -> dict:
    """One listening socket shared by the workers (``--no-reuse-port``) against one per
    worker (the default). Each round, which workers got the connections is recorded too."""
    shared = Served("webhook", cert_dir, workers, threads, ("--no-reuse-port",))
    own = Served("webhook", cert_dir, workers, threads)
    servers = {"shared": shared, "own": own}
    seen: dict[str, dict[str, list]] = {n: {"rps": [], "split": []} for n in servers}
    try:
        for _ in range(rounds):
            for name, server in servers.items():
                run = _start_wrk(server.url, body, 2, connections)
                time.sleep(1)
                split = _connections_per_worker(server)
                seen[name]["split"].append(split + [0] * (workers - len(split)))
                out = run.communicate()[0]
                seen[name]["rps"].append(float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]))
    finally:
        shared.stop()
        own.stop()
    median = {name: statistics.median(values["rps"]) for name, values in seen.items()}
    return {
        "rounds": seen,
        "median_rps": median,
        "ratio": round(median["own"] / median["shared"], 3),
    }


def _connections_per_worker(server: Served) -> list[int]:
    """How many established connections each worker process holds (from /proc)."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for row in (line.split() for line in table.readlines()[1:]):
            if row[1].endswith(f":{server.port:04X}") and row[3] == "01":
                inodes.add(row[9])
    counts = []
    for pid in _children(server.proc.pid):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        held = sum(1 for link in links if link.startswith("socket:[") and link[8:-1] in inodes)
        if held:
            counts.append(held)
    return sorted(counts, reverse=True)


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
