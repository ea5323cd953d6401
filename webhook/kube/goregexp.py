"""Go's ``regexp`` (RE2 syntax) searched in messages with unknown parts.

JobSet matches a failure-policy rule's ``onJobFailureMessagePatterns`` against a failed
Job's condition message with Go's ``regexp.MatchString`` (``anyMatchFound`` in
pkg/controllers/failure_policy.go): a pattern that does not compile is logged and skipped.
The messages we ask about are only partly known: the Job controller writes
``Container <name> for pod <namespace>/<pod> failed with exit code <code> matching
FailJob rule at index <i>``, and the pod's name is only known at run time. So a message
is given as pieces, a literal, one of several literals, or ``Wild`` (one or more
characters from a set), and ``Program.search`` answers whether the pattern matches
*some* message of that shape: exact for a fully known message, never "no" when one
possible message matches.

Patterns are parsed with Python's own regular expression parser, which reads RE2's
syntax the same way for everything this module accepts. Whatever Go and Python read
differently, or that Go rejects, raises ``Unsupported`` with the reason, so callers can
treat it conservatively: POSIX classes (``[[:alpha:]]``), ``\\p{...}``, ``\\Q...\\E``,
``\\z``/``\\Z``, back references, look-around, possessive and atomic groups, comments,
``(?x)``/``(?U)``-style flags, ``{,n}``, counts above 1000, escapes other than the
shared ones. The messages are ASCII without line breaks, where the remaining
differences (Unicode classes, ``$`` before a final newline) cannot show.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

try:
    from re import _constants as C  # type: ignore[attr-defined]
    from re import _parser as sre  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse as sre  # type: ignore[no-redef]

import re

#: What a pod name (or namespace) may contain: a DNS subdomain.
DNS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")
MAX_STATES = 20_000
MAX_REPEAT_COUNT = 1000  # Go's regexp/syntax limit
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_SPACE = frozenset("\t\n\f\r ")
_DIGIT = frozenset("0123456789")
#: Escapes Go and Python both read alike (besides escaped punctuation).
_SHARED_ESCAPES = frozenset("afnrtvdDsSwWAbBx")
_BOS, _EOS = "^", "$"  # context markers: no character (start, end of the text)


class Unsupported(ValueError):
    """A pattern this module cannot evaluate as Go would; the text says why."""


@dataclass(frozen=True)
class Wild:
    """One or more unknown characters, each from ``chars``."""

    chars: frozenset[str] = DNS_CHARS


Piece = str | tuple[str, ...] | Wild
CharTest = Callable[[str], bool]


def compile_go(pattern: str) -> Program:
    """The pattern as Go reads it, or ``Unsupported``."""
    _check_syntax(pattern)
    try:
        parsed = sre.parse(pattern)
    except (re.error, RecursionError, OverflowError) as err:
        raise Unsupported(f"not read alike by Go and Python ({err})") from err
    flags = parsed.state.flags
    if flags & (re.VERBOSE | re.ASCII | re.LOCALE):
        raise Unsupported("uses a flag Go's regexp does not have")
    program = Program()
    start, end = program.build(list(parsed), bool(flags & re.IGNORECASE), bool(flags & re.DOTALL))
    program.start, program.end = start, end
    return program


def _check_syntax(pattern: str) -> None:
    """Reject, from the text, what Python parses but Go reads otherwise or refuses."""
    if "[:" in pattern:
        raise Unsupported("POSIX character classes ([[:alpha:]]) are read differently")
    if "(?#" in pattern:
        raise Unsupported("Go has no (?#...) comments")
    if "{," in pattern:
        raise Unsupported("Go reads {,n} as literal text")
    in_class = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt.isalnum() and (nxt not in _SHARED_ESCAPES or (in_class and nxt == "b")):
                raise Unsupported(f"the escape \\{nxt} is not read alike by Go and Python")
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            i += 1
            if pattern[i : i + 1] == "^":
                i += 1
            if pattern[i : i + 1] == "]":
                i += 1  # a literal ] first in a class
            continue
        if ch == "]" and in_class:
            in_class = False
        i += 1


class Program:
    """A Thompson NFA: ``chars[s]`` are (test, next) edges, ``eps[s]`` empty moves,
    ``asserts[s]`` (kind, next) zero-width moves taken when the kind holds."""

    def __init__(self) -> None:
        self.chars: list[list[tuple[CharTest, int]]] = []
        self.eps: list[list[int]] = []
        self.asserts: list[list[tuple[object, int]]] = []
        self.start = self.end = 0

    def _state(self) -> int:
        if len(self.eps) >= MAX_STATES:
            raise Unsupported("too large to evaluate")
        self.chars.append([])
        self.eps.append([])
        self.asserts.append([])
        return len(self.eps) - 1

    def build(self, items: Sequence[tuple[object, object]], icase: bool, dotall: bool):
        start = current = self._state()
        for op, av in items:
            first, last = self._item(op, av, icase, dotall)
            self.eps[current].append(first)
            current = last
        return start, current

    def _item(self, op: Any, av: Any, icase: bool, dotall: bool) -> tuple[int, int]:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            a, b = self._state(), self._state()
            self.chars[a].append((_char_test(op, av, icase, dotall), b))
            return a, b
        if op is C.SUBPATTERN:
            add: int = av[1]
            delete: int = av[2]
            sub: Any = av[3]
            if (add | delete) & ~(re.IGNORECASE | re.MULTILINE | re.DOTALL):
                raise Unsupported("uses a flag Go's regexp does not have")
            icase = (icase or bool(add & re.IGNORECASE)) and not delete & re.IGNORECASE
            dotall = (dotall or bool(add & re.DOTALL)) and not delete & re.DOTALL
            return self.build(list(sub), icase, dotall)
        if op is C.BRANCH:
            a, b = self._state(), self._state()
            for alternative in av[1]:
                first, last = self.build(list(alternative), icase, dotall)
                self.eps[a].append(first)
                self.eps[last].append(b)
            return a, b
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            low: int = av[0]
            high: Any = av[1]
            repeated: Any = av[2]
            unbounded = high is C.MAXREPEAT
            if low > MAX_REPEAT_COUNT or (not unbounded and high > MAX_REPEAT_COUNT):
                raise Unsupported(f"Go refuses repeat counts above {MAX_REPEAT_COUNT}")
            return self._repeat(list(repeated), low, None if unbounded else high, icase, dotall)
        if op is C.AT and av in _ASSERTIONS:
            a, b = self._state(), self._state()
            self.asserts[a].append((av, b))
            return a, b
        raise Unsupported(f"uses {str(op).lower()}, which Go's regexp does not have")

    def _repeat(self, sub, low: int, high: int | None, icase: bool, dotall: bool):
        start = current = self._state()
        for _ in range(low):
            first, last = self.build(sub, icase, dotall)
            self.eps[current].append(first)
            current = last
        if high is None:
            first, last = self.build(sub, icase, dotall)
            self.eps[current].append(first)
            self.eps[last].append(current)
            return start, current
        end = self._state()
        self.eps[current].append(end)
        for _ in range(high - low):
            first, last = self.build(sub, icase, dotall)
            self.eps[current].append(first)
            self.eps[last].append(end)
            current = last
        return start, end

    # --- search ------------------------------------------------------------------------

    def search(self, pieces: Sequence[Piece]) -> bool:
        """Whether the pattern matches some text made of ``pieces`` (unanchored, as
        ``regexp.MatchString``): a literal, a tuple of alternative literals, or a
        ``Wild`` run. Exact when every piece is a plain literal."""
        steps = _positions(pieces)
        current: set[int] = set()
        before: frozenset[str] = frozenset(_BOS)
        return self._walk(steps, 0, current, before)

    def _walk(self, steps: list[_Step], index: int, current: set[int], before) -> bool:
        while index < len(steps):
            step = steps[index]
            after = _first(steps, index + 1)
            if isinstance(step, _Choice):
                return any(
                    self._walk(_literal(option) + steps[index + 1 :], 0, set(current), before)
                    for option in step.options
                )
            if isinstance(step, Wild):
                # One or more characters: the states after any number of them, together
                # (every boundary inside the run looks alike, so a match may start at
                # the first; a superset of what any one length reaches: never a false no).
                wild = step.chars
                reached = self._closure(current | {self.start}, before, wild)
                if self.end in reached:
                    return True
                seen: set[int] = set()
                frontier = self._move(reached, wild) | {self.start}
                while frontier - seen:
                    new = frontier - seen
                    seen |= new
                    reached = self._closure(new, wild, wild | after)
                    if self.end in reached:
                        return True
                    frontier = self._move(reached, wild)
                current, before = seen, wild
                index += 1
                continue
            reached = self._closure(current | {self.start}, before, frozenset(step))
            if self.end in reached:
                return True
            current, before = self._move(reached, frozenset(step)), frozenset(step)
            index += 1
        return self.end in self._closure(current | {self.start}, before, frozenset(_EOS))

    def _move(self, states: Iterable[int], chars: frozenset[str]) -> set[int]:
        return {nxt for s in states for test, nxt in self.chars[s] if any(map(test, chars))}

    def _closure(self, states: Iterable[int], before, after) -> set[int]:
        seen = set(states)
        stack = list(seen)
        while stack:
            state = stack.pop()
            targets = list(self.eps[state])
            targets += [nxt for kind, nxt in self.asserts[state] if _holds(kind, before, after)]
            for nxt in targets:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    def matches_everything(self) -> bool:
        """Whether it matches the empty string without any assertion, hence any text."""
        reached = {self.start}
        stack = [self.start]
        while stack:
            for nxt in self.eps[stack.pop()]:
                if nxt not in reached:
                    reached.add(nxt)
                    stack.append(nxt)
        return self.end in reached


@dataclass(frozen=True)
class _Choice:
    options: tuple[str, ...]


_Step = str | Wild | _Choice  # a str step is one character


def _literal(text: str) -> list[_Step]:
    return list(text)


def _positions(pieces: Sequence[Piece]) -> list[_Step]:
    steps: list[_Step] = []
    for piece in pieces:
        if isinstance(piece, str):
            steps.extend(piece)
        elif isinstance(piece, tuple):
            steps.append(_Choice(piece))
        else:
            steps.append(piece)
    return steps


def _first(steps: Sequence[_Step], index: int) -> frozenset[str]:
    """The characters that may come at ``steps[index]`` (end of text: none)."""
    if index >= len(steps):
        return frozenset(_EOS)
    step = steps[index]
    if isinstance(step, Wild):
        return step.chars
    if isinstance(step, _Choice):
        firsts = {option[:1] for option in step.options if option}
        if any(not option for option in step.options):
            firsts |= _first(steps, index + 1)
        return frozenset(firsts)
    return frozenset(step)


def _word(ch: str) -> bool:
    return ch in _WORD


_ASSERTIONS = (
    C.AT_BEGINNING,
    C.AT_BEGINNING_STRING,
    C.AT_END,
    C.AT_BOUNDARY,
    C.AT_NON_BOUNDARY,
)


def _holds(kind: object, before: frozenset[str], after: frozenset[str]) -> bool:
    """Whether the zero-width assertion may hold between a character of ``before`` and
    one of ``after`` (the text has no line breaks: ^ and $ are its ends in any mode)."""
    if kind in (C.AT_BEGINNING, C.AT_BEGINNING_STRING):
        return _BOS in before
    if kind is C.AT_END:
        return _EOS in after
    pairs = [(b, a) for b in before for a in after]
    boundary = [_word(b) != _word(a) for b, a in pairs]
    return any(boundary) if kind is C.AT_BOUNDARY else not all(boundary)


def _char_test(op: object, av: object, icase: bool, dotall: bool) -> CharTest:
    if op is C.ANY:
        return (lambda ch: True) if dotall else (lambda ch: ch != "\n")
    if op in (C.LITERAL, C.NOT_LITERAL):
        wanted = chr(av)  # type: ignore[arg-type]
        same = _folds(wanted) if icase else {wanted}
        if op is C.LITERAL:
            return lambda ch: ch in same
        return lambda ch: ch not in same and ch not in (_BOS, _EOS)
    members = list(av)  # type: ignore[call-overload]
    negate = bool(members) and members[0][0] is C.NEGATE
    if negate:
        members = members[1:]

    def inside(ch: str) -> bool:
        for kind, value in members:
            if kind is C.LITERAL and ch == chr(value):
                return True
            if kind is C.RANGE and value[0] <= ord(ch) <= value[1]:
                return True
            if kind is C.CATEGORY and _category(value, ch):
                return True
        return False

    def test(ch: str) -> bool:
        if ch in (_BOS, _EOS):
            return False
        hit = any(inside(c) for c in _folds(ch)) if icase else inside(ch)
        return hit != negate

    return test


def _folds(ch: str) -> set[str]:
    return {ch, ch.lower(), ch.upper()}


def _category(kind: object, ch: str) -> bool:
    """Go's Perl classes, ASCII only (RE2's \\d \\s \\w)."""
    table = {
        C.CATEGORY_DIGIT: (_DIGIT, False),
        C.CATEGORY_NOT_DIGIT: (_DIGIT, True),
        C.CATEGORY_SPACE: (_SPACE, False),
        C.CATEGORY_NOT_SPACE: (_SPACE, True),
        C.CATEGORY_WORD: (_WORD, False),
        C.CATEGORY_NOT_WORD: (_WORD, True),
    }
    if kind not in table:
        raise Unsupported(f"uses {str(kind).lower()}")
    chars, negate = table[kind]
    return (ch in chars) != negate
