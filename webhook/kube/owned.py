"""The parts of an object a mutator may write, and a copy that shares everything else.

A mutator edits a copy of the admitted object, and the patch is the diff between the
two. A full deep copy costs a walk of the whole object, and the diff then walks it again
to find the few places that changed; for a Job most of the object (containers, volumes,
managedFields, a kubectl last-applied record) is never written by any policy. A mutator
that declares what it may write (``Owned``) gets a copy that is new only along those
paths and shares every other subtree with the original, and the diff skips a shared
subtree at once (``a is b``). Profiling put the full copy and the full diff at half of a
Job's policy run.

The declaration is a contract: a mutator that wrote into a shared subtree would change the
request's object and lose that change from the patch. Tests run every Job and Pod the
suite knows, and generated ones, both ways and require the same patch and an untouched
original. Where the object's shape is not what the declaration expects (a list where a
mapping should be), that subtree is deep-copied, so a malformed object costs speed,
never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias


@dataclass(frozen=True)
class Each:
    """Every item of a list, each owned as ``item`` says (e.g. every container's env)."""

    item: Owned


class Shallow:
    """A mapping's or a list's own members (keys to add, items to append), not what
    they hold: a one-level copy."""


#: A declaration: ``ALL`` (the whole subtree may be written: copied deeply), ``SHALLOW``,
#: a mapping of keys to what is owned below each (the mapping itself is copied, its other
#: keys shared), or ``Each`` (the list is copied, and each item owned as it says).
Owned: TypeAlias = "dict[str, Owned] | Each | Shallow | None"
ALL: Owned = None
SHALLOW = Shallow()


def copy_owned(value: Any, owned: Owned) -> Any:
    """A copy of ``value`` that may be written where ``owned`` says, sharing the rest."""
    if owned is None:
        return deep_copy(value)
    if isinstance(owned, Shallow):
        if isinstance(value, dict):
            return dict(value)
        return list(value) if isinstance(value, list) else value
    if isinstance(owned, Each):
        if not isinstance(value, list):
            return deep_copy(value)
        return [copy_owned(item, owned.item) for item in value]
    if not isinstance(value, dict):
        return deep_copy(value)
    copied = dict(value)
    for key, below in owned.items():
        if key in copied:
            copied[key] = copy_owned(copied[key], below)
    return copied


def deep_copy(value: Any) -> Any:
    """A deep copy of a JSON value: new mappings and lists, shared scalars (immutable)."""
    if isinstance(value, dict):
        return {k: deep_copy(v) if isinstance(v, (dict, list)) else v for k, v in value.items()}
    if isinstance(value, list):
        return [deep_copy(v) if isinstance(v, (dict, list)) else v for v in value]
    return value
