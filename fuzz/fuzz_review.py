#!/usr/bin/env python3
"""Coverage-guided fuzzing of the review decoder and the whole admission data path.

Any input must end in a ReviewError (answered as HTTP 400) or a well-formed verdict;
anything else is a crash. ``make fuzz`` (or ``python fuzz/fuzz_review.py
fuzz/corpus/review -max_total_time=60``) runs it for a bounded time; new interesting
inputs are added to the corpus kept in the repository.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from webhook.admission import engine
    from webhook.admission import review as admission
    from webhook.admission.review import ReviewError
    from webhook.policy.config import Config

CONFIG = Config()


def test_one_input(data: bytes) -> None:
    try:
        request = admission.decode(data)
    except ReviewError:
        return
    for verdict in (engine.mutate(request, CONFIG), engine.validate(request, CONFIG)):
        body = admission.encode_bytes(request.uid, verdict)
        assert body.startswith(b'{"apiVersion":"admission.k8s.io/v1"'), body[:80]
        if not verdict.allowed:
            assert verdict.message


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
