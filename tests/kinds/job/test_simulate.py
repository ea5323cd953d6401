"""What each simulated pod is admitted with (``PodFacts``): the facts ``retry-webhook test``
asserts per attempt. Each is checked against the real pod webhook fed the same failures
through the real ``FailureHistory`` (``Source`` from test_failureaware)."""

from __future__ import annotations

import copy
import json

from testkit.builders import P
from testkit.failureaware import AVOID, FACTOR, Source, job_pod, sidecar, trainer
from testkit.workloads import mutate
from webhook import cli, explain
from webhook.kube.podspec import spot_requirements
from webhook.plan.failureaware import ContainerMemory
from webhook.plan.simulation import NextPod, PodFacts
from webhook.policy.config import Config, parse_config

WORKLOAD = {
    **FACTOR,
    **AVOID,
    P + "backoff-limit": "3",
    P + "non-spot-attempts": "1",
    P + "ignore-disruptions": "true",
}


def job(annotations=None, containers=None):
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "annotations": dict(annotations or WORKLOAD)},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": containers or [trainer(), sidecar()],
                }
            }
        },
    }


def simulated(obj, events, config=None):
    prepared, _ = cli.prepare(obj, None)
    (item,) = explain.explain(prepared, config or Config(), None, explain.parse_events(events))
    return item.simulation


def webhook_pod_facts(source, failures):
    """The real pod webhook's answer for the next pod of the Job after ``failures``
    counted failures: (memory of trainer, failed nodes kept off, non-spot), and the pod
    as admitted (what fails next, at the memory it was given)."""
    pod = job_pod(
        annotations={**FACTOR, **AVOID, P + "backoff-limit": "3", P + "non-spot-attempts": "1"}
    )
    source.failures = failures
    verdict, out = mutate(copy.deepcopy(pod), attempts=source)
    assert verdict.allowed, verdict.message
    trainer_ = next(c for c in out["spec"]["containers"] if c["name"] == "trainer")
    memory = (
        trainer_["resources"]["requests"]["memory"],
        trainer_["resources"]["limits"]["memory"],
    )
    applied = json.loads(out["metadata"]["annotations"].get(P + "applied", "{}"))
    avoided = applied.get("avoidedNodes", 0)
    terms = out["spec"].get("affinity", {}).get("nodeAffinity", {})
    required = terms.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    expressions = (required.get("nodeSelectorTerms") or [{}])[0].get("matchExpressions", [])
    non_spot = any(e in expressions for e in spot_requirements(Config().spot_node_labels))
    return (memory, avoided, non_spot), out


def test_each_pod_gets_what_the_pod_webhook_gives_it_after_the_failures_before():
    """oom, disruption (ignored: same attempt, its node not failed), oom: memory raised per
    OOM kill of trainer (logger never), one failed node per pod that failed on its node,
    and the last attempt (4 of backoffLimit 3 + 1) on non-spot nodes."""
    sim = simulated(job(), "oom,disruption,oom,oom")
    facts = [s.facts for s in sim.steps] + [sim.next.facts if sim.next else None]
    # The same failures fed to the real failure history, pod by pod.
    source = Source()
    counted = 0
    for number, (step, fact) in enumerate(zip([*sim.steps, None], facts, strict=True), 1):
        (memory, avoided, non_spot), admitted = webhook_pod_facts(source, counted)
        assert fact is not None
        (trainer_memory,) = [m for m in fact.memory if m.container == "trainer"]
        assert (trainer_memory.request, trainer_memory.limit) == memory, number
        assert fact.avoided_nodes == avoided, number
        assert fact.non_spot is non_spot, number
        if step is None:
            break
        disrupted = step.event == "disruption"
        source.fail(
            admitted,
            node=f"node-{number}",
            oom=() if disrupted else ("trainer",),
            deleting=disrupted,
        )
        counted += 0 if disrupted else 1
        if disrupted:
            source.failures -= 1  # Source counts every failure; an Ignore rule's is not
    assert [s.attempt for s in sim.steps] == [1, 2, 2, 3]
    assert sim.next == NextPod(
        5,
        4,
        PodFacts(
            True,
            (
                ContainerMemory("trainer", "6912Mi", "6912Mi"),
                ContainerMemory("logger", "64Mi", "-"),
            ),
            3,
        ),
    )


def test_the_admins_cap_on_avoided_nodes_holds():
    config = parse_config("guardRails: {maxAvoidedNodes: 1}\n")
    sim = simulated(job(), "1,1", config)
    assert [s.facts.avoided_nodes for s in sim.steps] == [0, 1]
    assert sim.next.facts.avoided_nodes == 1


def test_without_the_settings_a_pod_has_its_template_memory_and_avoids_nothing():
    sim = simulated(job({P + "backoff-limit": "1"}), "oom")
    (step,) = sim.steps
    assert step.facts == PodFacts(
        False, (ContainerMemory("trainer", "2Gi", "2Gi"), ContainerMemory("logger", "64Mi", "-")), 0
    )
    assert sim.next.attempt == 2 and sim.next.facts == step.facts


def test_an_ended_workload_has_no_next_pod_and_restart_on_failure_no_facts():
    assert simulated(job(), "oom,oom,oom,oom").next is None
    on_failure = job({P + "backoff-limit": "2"})
    on_failure["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    sim = simulated(on_failure, "1")
    assert sim.steps[0].facts is None and sim.next is None


def test_a_jobsets_runs_keep_the_failure_history_of_the_set():
    """JobSet lineages span restarts (``webhook.cluster.history``): memory and failed nodes
    carry over to the recreated child Job, and runs are placed by the restart count."""
    obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "set",
            "annotations": {
                **FACTOR,
                **AVOID,
                P + "backoff-limit": "2",
                P + "non-spot-attempts": "1",
            },
        },
        "spec": {
            "failurePolicy": {"maxRestarts": 2},
            "replicatedJobs": [
                {
                    "name": "workers",
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "template": {
                                "spec": {"restartPolicy": "Never", "containers": [trainer()]}
                            },
                        }
                    },
                }
            ],
        },
    }
    prepared, _ = cli.prepare(obj, None)
    items = explain.explain(prepared, Config(), None, explain.parse_events("oom,oom"))
    (workers,) = [i for i in items if i.simulation is not None]
    sim = workers.simulation
    assert [(s.run, s.facts.avoided_nodes) for s in sim.steps] == [(1, 0), (2, 1)]
    assert sim.next.run == 3 and sim.next.facts.non_spot is True
    assert sim.next.facts.memory == (ContainerMemory("trainer", "4608Mi", "4608Mi"),)
    assert sim.next.facts.avoided_nodes == 2
