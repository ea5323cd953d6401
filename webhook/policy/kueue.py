"""What the admin states of the cluster's Kueue (``kueue`` in the config file), and what it
means for ``retry-delay``.

Kueue's ``waitForPodsReady`` (its Configuration API, apis/config/v1beta2
configuration_types.go ``WaitForPodsReady``) evicts and requeues a whole admitted workload
whose ``PodsReady`` condition stays ``False`` too long: past ``timeout`` counted from its
admission (``WaitForPodsStart``), or past ``recoveryTimeout`` counted from the moment a
workload that was ready became not ready again (``WaitForRecovery``: a pod failed and its
replacement is awaited) (``admittedNotReadyWorkload`` in
pkg/controller/core/workload_controller.go). A retry held back by our scheduling gate is
such a replacement: while it waits, the Job's ``ready`` count is short
(``Job.PodsReady`` in pkg/controller/jobs/job/job_controller.go; a JobSet's, its
replicated Jobs' ready and succeeded). Kueue's defaults (``SetDefaults_Configuration`` in
apis/config/v1beta2/defaults.go): ``timeout`` 30m, ``recoveryTimeout`` the ``timeout``
(``0s`` turns the recovery check off: ``waitForPodsReady`` in
pkg/controller/core/core.go); from Kueue v0.19 ``waitForPodsReady`` is on unless the
feature gate ``DisableWaitForPodsReady`` turns it off, before that only when configured
(v1beta1: ``enable: true``).

The config states them the way Kueue's own configuration does::

    kueue:
      waitForPodsReady:         # as in Kueue's Configuration
        enable: true            # false: Kueue evicts nobody for PodsReady (no check)
        timeout: 10m            # Go durations, as Kueue reads them; default 30m
        recoveryTimeout: 5m     # default: timeout; 0s: off
      startupAllowance: 1m      # what a released pod needs to become Ready; default 1m
      retryDelay: cap           # cap (default) or deny a longer retry-delay

The longest wait Kueue tolerates is the smaller timeout (``recoveryTimeout`` when on)
less ``startupAllowance``: a pod let go at that moment must still be scheduled, start and
pass its readiness probe before Kueue looks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from webhook.policy.grammar import format_duration

#: ``QUEUE_LABEL`` queues a workload in a Kueue LocalQueue (read by
#: ``QueueNameForObject`` in pkg/controller/jobframework/utils.go).
#: Kueue's ``DefaultWaitForPodsReadyTimeout`` (apis/config/v1beta2/defaults.go).
DEFAULT_TIMEOUT = 30 * 60
DEFAULT_STARTUP_ALLOWANCE = 60
MODES = ("cap", "deny")

KEYS = ("waitForPodsReady", "startupAllowance", "retryDelay")
WAIT_KEYS = ("enable", "timeout", "recoveryTimeout")
#: Go's ``time.ParseDuration`` units, in seconds.
_GO_UNITS = {
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "\u00b5s": Decimal("1e-6"),  # micro sign, as Go accepts it
    "\u03bcs": Decimal("1e-6"),  # Greek mu, likewise
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}
_GO_PART = re.compile("([0-9]*(?:\\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


@dataclass(frozen=True)
class Kueue:
    """The cluster's Kueue as the config states it. ``stated`` is ``False`` when the
    config says nothing of ``waitForPodsReady``: the webhook then warns but cannot check."""

    stated: bool = False
    enabled: bool = True
    #: Seconds (whole, rounded down: a shorter limit is the safe side).
    timeout: int = DEFAULT_TIMEOUT
    #: Seconds; 0: Kueue does not check recovery.
    recovery_timeout: int = DEFAULT_TIMEOUT
    startup_allowance: int = DEFAULT_STARTUP_ALLOWANCE
    retry_delay: str = "cap"

    def bound(self) -> tuple[int, str]:
        """The timeout a retry's wait runs against, and its name with its value."""
        if 0 < self.recovery_timeout < self.timeout:
            return self.recovery_timeout, (
                f"recoveryTimeout {format_duration(self.recovery_timeout)}"
            )
        return self.timeout, f"timeout {format_duration(self.timeout)}"

    def describe(self) -> str:
        """What the webhook does with ``retry-delay`` on a queued workload, in a line."""
        if not self.stated:
            return "waitForPodsReady not stated: retry-delay is only warned of"
        if not self.enabled:
            return "waitForPodsReady off: retry-delay is not checked"
        _, name = self.bound()
        then = "capped" if self.retry_delay == "cap" else "denied (a default: capped)"
        return (
            f"a retry waits at most {format_duration(self.longest_wait())} (waitForPodsReady "
            f"{name} less startupAllowance {format_duration(self.startup_allowance)}); a "
            f"longer retry-delay is {then}"
        )

    def longest_wait(self) -> int:
        """The longest a retry may be held back: the bound less the startup allowance."""
        return self.bound()[0] - self.startup_allowance


def parse_go_duration(text: str) -> Decimal:
    """Seconds from a Go duration (``time.ParseDuration``: ``30m``, ``1h30m``, ``90s``,
    ``1.5h``, ``300ms``, ``0``), as Kueue reads its own config; no sign accepted (Kueue
    refuses negative timeouts: ``validateWaitForPodsReady`` in pkg/config/validation.go)."""
    if text == "0":
        return Decimal(0)
    total, at = Decimal(0), 0
    while at < len(text):
        match = _GO_PART.match(text, at)
        if match is None or match.group(1) in ("", "."):
            raise ValueError(f"{text!r} is not a duration")
        try:
            total += Decimal(match.group(1)) * _GO_UNITS[match.group(2)]
        except InvalidOperation as err:
            raise ValueError(f"{text!r} is not a duration") from err
        at = match.end()
    if not text:
        raise ValueError("'' is not a duration")
    return total
