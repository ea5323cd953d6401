"""Live config reload on the real server (2 gunicorn workers): the config file is a
ConfigMap-style mount (symlinks into a ``..data`` directory swapped atomically)."""

from __future__ import annotations

import json
import os
import signal

from testkit.builders import apply, decode_patch, job, review
from testkit.servers import KubeletVolume, eventually, free_port, metric, start, stop
from webhook.policy.config import Config
from webhook.serving.reload import ConfigReloader

RELOADS = "retry_webhook_config_reloads_total"


def backoff_limits(server, count: int) -> set[int]:
    """backoffLimit the server gives a plain Job (no annotations), over ``count`` reviews."""
    seen = set()
    for _ in range(count):
        obj = job()
        out = apply(obj, decode_patch(server.review("/mutate", review(obj))))
        seen.add(out["spec"]["backoffLimit"])
    return seen


def every_worker_gives(server, limit: int) -> None:
    # 16 fresh connections in a row, spread by the kernel over both workers
    eventually(lambda: backoff_limits(server, 16) == {limit}, timeout=20, interval=0.2)


def reload_logs(server, message: str) -> list[dict]:
    return [line for line in server.logs() if line.get("msg", "").startswith(message)]


def test_config_reload_valid_then_invalid_then_valid(tmp_path):
    root = tmp_path / "config"
    root.mkdir()
    volume = KubeletVolume(root)
    volume.publish({"config.yaml": b"defaults:\n  backoff-limit: 2\n"})
    server = start(
        tmp_path / "certs",
        "--config",
        str(root / "config.yaml"),
        workers=2,
        metrics_port=free_port(),
    )
    try:
        assert backoff_limits(server, 4) == {2}

        volume.publish({"config.yaml": b"defaults:\n  backoff-limit: 4\n"})
        every_worker_gives(server, 4)
        eventually(lambda: metric(server.metrics(), RELOADS, result="success") == 2)
        assert len({line["pid"] for line in reload_logs(server, "config reloaded")}) == 2

        volume.publish({"config.yaml": b"defaults:\n  backoff-limit: lots\n  bakoff: 1\n"})
        eventually(lambda: metric(server.metrics(), RELOADS, result="failure") == 2)
        samples = server.metrics()
        assert metric(samples, "retry_webhook_config_last_reload_successful") == 0
        assert backoff_limits(server, 16) == {4}  # the last good config stays in force
        refused = reload_logs(server, "config reload refused")
        assert len(refused) == 2  # once per worker, not once per check
        problems = " ".join(refused[0]["problems"])
        assert "defaults.backoff-limit" in problems and "did you mean backoff-limit" in problems
        status, _, raw = server.request("GET", "/readyz")
        body = json.loads(raw)
        assert status == 200 and "2 problem(s)" in body["configReloadError"]

        # A worker that dies now is replaced by one that cannot load the file: it must
        # boot anyway (on the config the server started with), or gunicorn would stop.
        os.kill(refused[0]["pid"], signal.SIGKILL)
        eventually(lambda: len(reload_logs(server, "config reload refused; the config loaded")))
        assert server.proc.poll() is None

        volume.publish({"config.yaml": b"defaults:\n  backoff-limit: 5\n"})
        every_worker_gives(server, 5)
        eventually(
            lambda: metric(server.metrics(), "retry_webhook_config_last_reload_successful") == 1
        )
        assert json.loads(server.request("GET", "/readyz")[2])["configReloadError"] is None
    finally:
        stop(server)
    assert server.proc.returncode == 0


def test_reloader_sees_in_place_edits_and_keeps_the_last_good(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("defaults:\n  backoff-limit: 1\n")
    applied: list[Config] = []
    results: list[bool] = []
    reloader = ConfigReloader(path, applied.append, results.append)
    assert reloader.load().defaults == {"backoff-limit": 1}
    assert reloader.check() is None  # unchanged: nothing read
    with open(path, "w") as handle:  # an editor writing in place: same inode
        handle.write("defaults:\n  backoff-limit: 7\n")
    assert reloader.check() is True
    assert applied[-1].defaults == {"backoff-limit": 7}
    path.write_text("defaults: [")
    assert reloader.check() is False
    assert reloader.check() is None  # the same bad version is judged once
    assert "not valid YAML" in reloader.last_error
    path.unlink()
    assert reloader.check() is False  # a missing file is refused too
    assert len(applied) == 1 and results == [True, False, False]


def test_a_worker_starting_on_a_bad_file_falls_back(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("defaults: {backoff-limit: many}\n")
    results: list[bool] = []
    reloader = ConfigReloader(path, lambda config: None, results.append)
    started_with = Config(defaults={"backoff-limit": 3})
    assert reloader.load(started_with) is started_with
    assert results == [False] and "backoff-limit" in reloader.last_error
    assert reloader.check() is None  # the same bad version is not judged again
