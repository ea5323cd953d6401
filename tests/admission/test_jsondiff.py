"""The differ that derives every patch: applying diff(a, b) to a must give exactly b."""

from __future__ import annotations

import copy

import jsonpatch
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.admission.jsondiff import diff, escape

scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8)
keys = st.text(alphabet="ab/~0 .-", min_size=0, max_size=4)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=25,
)
documents = st.dictionaries(keys, json_values, max_size=5)


def exact(value):
    """JSON identity: distinguishes 1 from True, and key order does not matter."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


@settings(max_examples=400, deadline=None)
@given(documents, documents)
def test_diff_of_unrelated_documents_applies(a, b):
    patch = diff(a, b)
    assert exact(jsonpatch.apply_patch(copy.deepcopy(a), patch)) == exact(b)


@st.composite
def edited(draw):
    """A document and an edited copy: the shape of real mutations (add keys, append to
    lists, replace values, remove keys) at random depths."""
    original = draw(documents)
    mutated = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, 5))):
        node = mutated
        while True:
            children = [
                (k, v)
                for k, v in (node.items() if isinstance(node, dict) else enumerate(node))
                if isinstance(v, (dict, list))
            ]
            if not children or draw(st.booleans()):
                break
            node = draw(st.sampled_from(children))[1]
        action = draw(st.sampled_from(["add", "replace", "remove"]))
        if isinstance(node, dict):
            key = draw(keys)
            if action == "remove" and node:
                node.pop(draw(st.sampled_from(sorted(node))))
            else:
                node[key] = draw(json_values)
        elif action == "add" or not node:
            node.append(draw(json_values))
        elif action == "replace":
            node[draw(st.integers(0, len(node) - 1))] = draw(json_values)
        else:
            node.pop()
    return original, mutated


@settings(max_examples=400, deadline=None)
@given(edited())
def test_diff_of_edits_applies_and_touches_only_edits(pair):
    original, mutated = pair
    patch = diff(original, mutated)
    assert exact(jsonpatch.apply_patch(copy.deepcopy(original), patch)) == exact(mutated)
    assert all(op["op"] in ("add", "remove", "replace") for op in patch)


def test_equal_documents_give_empty_patch():
    doc = {"a": [1, {"b": "c"}], "d/e": {"~": None}}
    assert diff(doc, copy.deepcopy(doc)) == []


def test_type_changes_are_replaced():
    assert diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert diff({"a": 1}, {"a": 1.5}) == [{"op": "replace", "path": "/a", "value": 1.5}]
    assert diff({"a": [1]}, {"a": {"0": 1}}) == [{"op": "replace", "path": "/a", "value": {"0": 1}}]


def test_number_to_boolean_edits_inside_containers_python_calls_equal():
    """``{"b": [0]} == {"b": [False]}`` in Python: the edit must still be found, where
    containers are walked and where the items before an append are compared whole."""
    nested = ({"a": {"b": [0, 1.0]}}, {"a": {"b": [False, 1]}})
    assert diff(*nested) == [
        {"op": "replace", "path": "/a/b/0", "value": False},
        {"op": "replace", "path": "/a/b/1", "value": 1},
    ]
    before, after = {"l": [[0]]}, {"l": [[False], 2]}
    patch = diff(before, after)
    assert {"op": "replace", "path": "/l/0/0", "value": False} in patch
    assert exact(jsonpatch.apply_patch(copy.deepcopy(before), patch)) == exact(after)


def test_appends_are_adds_at_the_end_and_removals_from_the_end():
    assert diff({"l": [1]}, {"l": [1, 2, 3]}) == [
        {"op": "add", "path": "/l/1", "value": 2},
        {"op": "add", "path": "/l/2", "value": 3},
    ]
    assert diff({"l": [1, 2, 3]}, {"l": [1]}) == [
        {"op": "remove", "path": "/l/2"},
        {"op": "remove", "path": "/l/1"},
    ]


def test_pointer_escaping():
    assert escape("a/b~c") == "a~1b~0c"
    assert escape("~1") == "~01"
    assert diff({}, {"retry-policy.dev/x": "1"}) == [
        {"op": "add", "path": "/retry-policy.dev~1x", "value": "1"}
    ]
