"""The reviews are answered in front of Flask (``webhook.serving.app.AdmissionDispatch``):
the same status, headers and bytes as Flask's view of the same app answers, for every
kind of request a review endpoint gets, and Flask's own 500 when an answer fails."""

from __future__ import annotations

import io
import json

import pytest

from testkit.builders import FULL, job, review
from webhook.serving.app import MAX_BODY_BYTES, State, create_app

VALID = json.dumps(review(job(FULL))).encode()


def _call(app, method: str, path: str, body: bytes, headers: dict[str, str]):
    """The app called as a WSGI server calls it: status line, headers and body."""
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "8443",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "localhost:8443",
        "wsgi.url_scheme": "https",
        "wsgi.input": io.BytesIO(body),
        "wsgi.input_terminated": True,
        "wsgi.errors": io.StringIO(),
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
        **headers,
    }
    started = {}

    def start_response(status, response_headers, exc_info=None):
        started["status"], started["headers"] = status, response_headers

    content = b"".join(app(environ, start_response))
    return started["status"], sorted(started["headers"]), content


CASES = {
    "a review": (VALID, {"CONTENT_TYPE": "application/json"}),
    "a review, charset given": (VALID, {"CONTENT_TYPE": "application/json; charset=utf-8"}),
    "not JSON": (b"{", {"CONTENT_TYPE": "application/json"}),
    "not a review": (b"{}", {"CONTENT_TYPE": "application/json"}),
    "another content type": (VALID, {"CONTENT_TYPE": "text/plain"}),
    "a length over the limit": (
        b"",
        {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(MAX_BODY_BYTES + 1)},
    ),
    "a body shorter than its length": (
        VALID,
        {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(VALID) + 10)},
    ),
}


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_review_gets_what_flask_answers(case, path):
    body, headers = CASES[case]
    headers = {"CONTENT_LENGTH": str(len(body)), **headers}
    app = create_app(State())
    # werkzeug reads a method in lower case as POST: Flask's view answers that one.
    assert _call(app, "POST", path, body, headers) == _call(app, "post", path, body, headers)


def test_an_answer_that_fails_gets_flasks_500(monkeypatch, caplog):
    from webhook.serving import app as served

    def broken(uid, verdict):
        raise RuntimeError("broken")

    monkeypatch.setattr(served.codec, "encode_bytes", broken)
    app = create_app(State())
    headers = {"CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(VALID))}
    ours = _call(app, "POST", "/mutate", VALID, headers)
    flasks = _call(app, "post", "/mutate", VALID, headers)
    assert ours == flasks
    assert ours[0] == "500 INTERNAL SERVER ERROR"
    assert json.loads(ours[2])["error"] == "InternalServerError"
    logged = [r for r in caplog.records if r.getMessage() == "Exception on /mutate [POST]"]
    assert len(logged) == 2 and all(r.exc_info for r in logged)


@pytest.mark.parametrize("method, path", [("GET", "/mutate"), ("POST", "/mutate/"), ("GET", "/")])
def test_everything_else_is_flasks(method, path):
    status, _, content = _call(create_app(State()), method, path, b"", {})
    assert status.startswith(("404", "405"))
    assert json.loads(content)["error"] in ("NotFound", "MethodNotAllowed")
