"""The simulation of a bare Pod (v1): its containers' restarts in place; nothing retries
a Pod that fails."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from webhook.kinds import inplacewords
from webhook.kinds.inplacewords import Backoff
from webhook.kube.restartrules import PodRestarts
from webhook.plan.inplace import InPlaceEnds
from webhook.plan.simulation import (
    Ending,
    Event,
    ExplainError,
    Simulation,
    Step,
    walk,
)


class PodSimulator:
    """A bare Pod's containers through ``--simulate``: exits its restart rules match
    restart them in place; any other fails the pod, which nothing retries."""

    def __init__(self, containers: Sequence[str], restarts: PodRestarts, bound: InPlaceEnds):
        self.containers = list(containers) or ["main"]
        self.restarts = restarts
        self.bound = bound

    @staticmethod
    def judge_exit(container: str, code: int) -> tuple[str, str]:
        return "pod-fails", "the pod fails; nothing retries a Pod"

    def run(self, events: Sequence[Event]) -> Simulation:
        backoff = Backoff()
        main = self.containers[0]

        def step(number: int, event: Event) -> tuple[Step, Ending | None]:
            done, problem = inplacewords.restarted(self.restarts, backoff, event, main)
            if problem:
                raise ExplainError(problem)
            what = event.describe(main)
            made = Step(1, 1, "", event.token, what, None, None, False, 0, "")
            if done:
                result = inplacewords.restart_text(done)
                return dataclasses.replace(made, result=result, in_place=done), None
            result = "the pod fails; nothing retries a Pod"
            ending = Ending("Failed", None, f"event {number} fails it")
            return dataclasses.replace(made, result=result), ending

        steps, ending, unused = walk(events, step)
        still = Ending("Running", None, "the pod goes on")
        summary = inplacewords.summary(backoff, self.bound, "Pod")
        return Simulation(
            [e.token for e in events],
            steps,
            ending or still,
            unused,
            "exit",
            "phase Failed",
            summary,
        )
