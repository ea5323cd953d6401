"""``retry-webhook explain`` in process: a Job as a user writes it, explained; its settings and
plan rows picked out; its text held to its JSON; the outputs the docs show.
"""

from __future__ import annotations

import copy
import json
import re

from testkit.tools import ROOT
from webhook import cli, explain
from webhook.plan.explained import AttemptRow
from webhook.policy.config import Config


def manifest(annotations=None, *, spec=None, containers=("main",), namespace=None, name="train"):
    """A Job as a user writes it (explain prepares it as the API server would)."""
    obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": c, "image": "busybox:1.36"} for c in containers],
                }
            }
        },
    }
    if namespace:
        obj["metadata"]["namespace"] = namespace
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    if spec:
        obj["spec"].update(copy.deepcopy(spec))
    return obj


def explained(obj, config=None, events=None, namespace=None):
    prepared, _ = cli.prepare(obj, namespace)
    parsed = explain.parse_events(events) if events is not None else None
    return explain.explain(prepared, config or Config(), namespace, parsed)


def one(obj, config=None, events=None, namespace=None):
    (item,) = explained(obj, config, events, namespace)
    return item


def setting(item, name):
    (found,) = [s for s in item.settings if s.name == name]
    return found


def rows(plan):
    return [r for r in plan.rows if isinstance(r, AttemptRow)]


def plan_lines(text):
    """The rows (and gap lines) of the plan table in ``text``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Attempt plan"))
    header = next(i for i in range(start, len(lines)) if re.match(r"  (attempt|run) ", lines[i]))
    body = []
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        if re.match(r"  (\d+|\.\.\.) ", line):
            body.append(line)
    return body


def flat(text):
    return " ".join(text.split())


def assert_text_and_json_agree(item):
    """One explanation says the same in its text and in its JSON: settings, budget, rules,
    examples, plan rows and gaps, simulated steps and outcome, notes."""
    text = explain.render_text([item])
    (data,) = explain.to_json([item])["items"]
    assert json.loads(json.dumps(data)) == data  # plain data
    words = flat(text)
    for s in data["settings"]:
        assert re.search(rf"^  {re.escape(s['name'])} +\S+ +{re.escape(s['text'])}", text, re.M)
    for sentence in [data["budget"], *data["examples"], *data["notes"], *data["changes"]]:
        assert flat(sentence) in words
    assert len(re.findall(r"^  \d+\. ", text, re.M)) == len(data["rules"])
    assert flat(data["rulesIntro"]) in words and bool(data["rulesIntro"]) is bool(data["rules"])
    for rule in data["rules"]:
        assert f"({rule['action']}); {rule['origin']}." in words
    if data["plan"] is None:
        assert "Attempt plan" not in text
    else:
        body = plan_lines(text)
        plan = data["plan"]
        assert len(body) == len(plan["rows"]) + len(plan["omitted"])
        shown = [line.split()[:2] for line in body if not line.lstrip().startswith("...")]
        assert shown == [[str(r["attempt"]), str(r["failuresBefore"])] for r in plan["rows"]]
        assert sum("non-spot only" in line for line in body) == sum(
            r["nodes"] == "non-spot only" for r in plan["rows"]
        )
    sim = data["simulation"]
    if sim is None:
        assert "Simulation of" not in text
        return
    outcome = sim["outcome"]
    if outcome["reason"]:
        assert f"reason {outcome['reason']}" in words or outcome["state"] == "IndexFailed"
    owner = data["owner"]
    assert (f"Outcome: the {owner} is still running" in words) is (outcome["state"] == "Running")
    assert (f"Outcome: the {owner} fails; {sim['failedAs']}" in words) is (
        outcome["state"] == "Failed"
    )
    steps = re.findall(r"^  (?:pod \d+ \(|attempt \d+: )", text, re.M)
    assert len(steps) == len(sim["steps"])
    for step in sim["steps"]:
        assert flat(step["what"]) in words


def doc_block(after, page="docs/EXPLAIN.md"):
    """The fenced block after the marker ``after`` in ``page``."""
    text = (ROOT / page).read_text()
    start = text.index(after)
    block = text.index("```\n", text.index("```", start) + 3)
    opening = text.index("\n", text.index("```", start)) + 1
    return text[opening:block]
