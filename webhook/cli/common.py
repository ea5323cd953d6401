"""What every command shares: its exit codes, stable for pipelines (``webhook.cli``)."""

from __future__ import annotations

EXIT_OK, EXIT_DENIED, EXIT_INPUT = 0, 1, 2
EXIT_FAILED = 1  # a command that could not finish (e.g. the API failed): run it again
#: The reader of the output went away (``retry-webhook dry-run ... | head``): 128 + SIGPIPE,
#: what a shell reports for a command the closed pipe stopped.
EXIT_PIPE = 141
