"""The CLI run in process (its parser, its commands, their exit code and streams), and the
manifests the tests of the offline commands write for it.
"""

from __future__ import annotations

import io
import sys

from webhook import cli

JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  annotations:
    retry-policy.dev/backoff-limit: "{limit}"
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{{name: main, image: busybox:1.36}}]
"""


def run(argv, stdin=""):
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        args = cli.build_parser().parse_args(argv)
        code = args.func(args, out, err)
    finally:
        sys.stdin = old
    return code, out.getvalue(), err.getvalue()


#: Admitted, with a warning that the setting does nothing (not a change).
WARNED = JOB.replace(
    '"{limit}"', '"{limit}"\n    retry-policy.dev/on-non-retriable: fail-index'
).format(name="warned", limit=1)
NO_EFFECT = (
    "retry-policy: on-non-retriable has no effect without fail-non-retriable or fail-categories"
)
