"""The decision log's batching: every line written once, whole, and soon."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from webhook.serving import logs


@pytest.fixture
def stream():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("test.decisions")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield out
    logger.handlers[:] = []


def lines(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_quiet_server_writes_each_line_at_once(stream):
    log = logs.DecisionLog("test.decisions", max_delay=0.1)
    log.write({"uid": "a"})
    assert [line["uid"] for line in lines(stream)] == ["a"]


def test_a_busy_server_writes_in_batches_and_loses_nothing(stream):
    log = logs.DecisionLog("test.decisions", max_delay=3600, max_lines=50)
    log.write({"uid": "first"})  # the first line goes at once
    written = len(lines(stream))

    def serve(thread: int) -> None:
        for i in range(300):
            log.write({"uid": f"{thread}-{i}"})

    threads = [threading.Thread(target=serve, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert written == 1
    logs.flush_decisions()  # what is still queued: the maintenance loop (or exit)
    uids = [line["uid"] for line in lines(stream)]
    assert len(uids) == len(set(uids)) == 1 + 8 * 300
    for t in range(8):  # each thread's lines in the order it wrote them
        mine = [u for u in uids if u.startswith(f"{t}-")]
        assert mine == [f"{t}-{i}" for i in range(300)]
    assert all(line["msg"] == "admission decision" for line in lines(stream))


def test_lines_wait_for_the_delay_or_the_batch_size(stream):
    log = logs.DecisionLog("test.decisions", max_delay=3600, max_lines=50)
    log.write({"uid": "first"})
    for i in range(10):
        log.write({"uid": str(i)})
    assert len(lines(stream)) == 1
    for i in range(10, 49):
        log.write({"uid": str(i)})
    assert len(lines(stream)) == 1  # 49 queued
    log.write({"uid": "49"})
    assert len(lines(stream)) == 51  # the 50th queued line wrote them all
    log.write({"uid": "last"})
    logs.flush_decisions()
    assert lines(stream)[-1]["uid"] == "last"
