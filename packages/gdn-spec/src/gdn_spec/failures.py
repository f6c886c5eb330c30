"""The message of a failed suite test as ``gdn-spec check`` reports it (the summary's FAILED list and ``--json``).

A failure is reported by its own message — the assertion's text, or the exception and its message — on one line,
never by a traceback. What a kernel's author can act on is kept: the figures (every packed sequence's, for a varlen
failure), Hypothesis's failing example (the inputs), and pytest's comparison of a short assertion (``(2, 6, 256,
15) == (2, 6, 256, 16)``). What they cannot is dropped: Hypothesis's advice to decorate the test with
``@reproduce_failure`` / ``@seed`` (the suite is an installed package, not their source) and pytest's re-printing of
operands (whole arrays, function reprs with addresses).
"""

from __future__ import annotations

import re
from typing import Any

# Long enough for every figure the suite writes (a three-sequence varlen failure is ~900 characters, a numerics
# failure with its Hypothesis example ~500); a cap only guards the summary against an exception quoting a tensor.
FAILURE_CHARS = 4000
# pytest's explanation of an assertion is kept when it and the assertion's own message are this short: a
# comparison of sizes or dtypes, not of arrays.
EXPLANATION_CHARS = 300
MESSAGE_CHARS_FOR_EXPLANATION = 200
SEPARATOR = " | "

# "[ran at Dk=16, Dv=16 instead of ...] " in front of the message of a test run at other head dims.
_SIZES_NOTE = re.compile(r"\[ran at [^\n]*?\] ")
# Hypothesis's lines asking to edit the test's source to replay the example.
_REPLAY_ADVICE = re.compile(r"You can reproduce this|@reproduce_failure\(|@seed\(", re.IGNORECASE)
# The start of Hypothesis's failing example, printed as a call over several lines.
_EXAMPLE = re.compile(r"^(?:Falsifying|Failing) (?:explicit )?(?:example|test case)\b", re.MULTILINE)
# Where pytest's explanation of an assert statement starts (after the assertion's message, or the message itself).
_EXPLANATION = re.compile(r"(?:^|\n)(?:AssertionError: )?(?=assert )")
_COMPARISON = re.compile(r" (?:==|!=|<=|>=|<|>|not in|in|is not|is) ")
# pytest's lines naming where an operand came from ("+  where None = <function search at 0x7f...>(...)"): never
# actionable from a summary.
_EXPLANATION_NOISE = re.compile(r"^\s*(?:\+\s+where\b|\+\s+and\b)")
# Where pytest's verbose tail starts: its hint to rerun verbosely, or the line-by-line diff of the operands it prints
# under -v or whenever the CI environment variable is set. Both repeat the comparison line above them, so what
# follows is dropped; the summary then reads the same in CI as on a developer's machine.
_EXPLANATION_TAIL = re.compile(r"^\s*(?:Use -v to get|Full diff:)")


def returned_kind(result: Any) -> str:
    """What a kernel returned, for the message refusing it: "a tuple of 3 items", "a list of 2 items", "ndarray".

    A kernel returning (out, state, extra) was told it returned "tuple", which reads as the right type."""
    if isinstance(result, (tuple, list)):
        items = len(result)
        return f"a {type(result).__name__} of {items} item{'' if items == 1 else 's'}"
    return type(result).__name__


def failure_message(report: Any, limit: int = FAILURE_CHARS) -> str:
    """The failure's own message, on one line.

    Args:
        report (pytest.TestReport): a failed test's report.
        limit (int): the most characters kept; a longer message is cut at a part boundary and says how much was cut.

    Returns:
        str: the message's parts (its lines, a packed sequence's figures, ...) joined by " | ".

    Notes:
        Hypothesis's failing example is kept as one part, ``Failing test case: check(shape=..., seed=..., ...)``.
    """
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    text = "\n".join(line for line in text.splitlines() if not _REPLAY_ADVICE.search(line))
    note = _SIZES_NOTE.match(text)  # the sizes a test ran at (plugin.note_substitution), kept in front
    prefix, text = (note.group(0), text[note.end() :]) if note else ("", text)
    text, example = _split_example(text)
    message, explanation = _split_explanation(text)
    parts = _lines(message)
    if explanation and (not parts or len(message) <= MESSAGE_CHARS_FOR_EXPLANATION):
        parts += _useful_explanation(explanation, keep_any=not parts)
    if example:
        parts.append(example)
    return cap(prefix + SEPARATOR.join(parts), limit)


def cap(message: str, limit: int) -> str:
    """``message`` within ``limit`` characters, a cut one saying exactly how many characters were cut.

    Args:
        message (str): the failure's message.
        limit (int): the most characters returned.

    Returns:
        str: ``message`` when it fits; otherwise its longest prefix of whole parts (split after " | ", then after
        "; ") that fits with the note ``[... N more characters cut]``, so a cut message never ends mid-figure; when
        not even its first part fits, the prefix up to its last space within the room left (mid-word when there
        is none); when not even the note fits, the first ``limit`` characters.

    Notes:
        N is exactly ``len(message)`` minus the prefix kept, which is the message's own characters (a cut
        without a space used to add one, counting one character short). A cut at a space reserves the longest
        note, the one with nothing kept (N only shrinks as more is kept), so no limit is exceeded; a fixed 40
        characters were reserved before, and ``cap('y' * 100, 30)`` returned 118.
    """
    if len(message) <= limit:
        return message

    def note(kept: str) -> str:
        return f"[... {len(message) - len(kept)} more characters cut]"

    room = limit - len(note(""))  # the longest note: the count can only shrink as more is kept
    if room < 0:
        return message[:limit]
    kept = ""
    for piece in re.split(r"(?<= \| )|(?<=; )", message):
        if len(kept) + len(piece) + len(note(kept + piece)) > limit:
            break
        kept += piece
    if not kept:  # one unbroken part longer than the room (an exception quoting a tensor): cut at a space
        head = message[:room]
        kept = head[: head.rfind(" ") + 1] or head
    return kept + note(kept)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines() if line.strip()]


def _split_example(text: str) -> tuple[str, str]:
    """(the text without Hypothesis's failing example, the example as one line: ``check(a=1, b=2)``)."""
    match = _EXAMPLE.search(text)
    if match is None:
        return text, ""
    lines = text[match.start() :].splitlines()
    end = next((i for i, line in enumerate(lines) if line.strip() == ")"), len(lines) - 1)
    example = " ".join(line.strip() for line in lines[: end + 1] if line.strip())
    example = re.sub(r",?\s+\)$", ")", re.sub(r"\(\s+", "(", example))
    rest = "\n".join(lines[end + 1 :])
    return text[: match.start()] + rest, example


def _split_explanation(text: str) -> tuple[str, str]:
    """(the assertion's message, pytest's explanation starting at ``assert ...``, or "")."""
    match = _EXPLANATION.search(text)
    if match is None:
        return text, ""
    return text[: match.start()], text[match.end() :]


def _useful_explanation(explanation: str, keep_any: bool) -> list[str]:
    """pytest's explanation when it compares short operands (sizes, dtypes), without where-lines; with ``keep_any``
    (an assertion without a message) at least its first line, cut, so the failure says something."""
    lines = []
    for line in _lines(explanation):
        if _EXPLANATION_TAIL.match(line):
            break
        if not _EXPLANATION_NOISE.match(line):
            lines.append(line)
    if not lines:
        return []
    if _COMPARISON.search(lines[0]) and len(" ".join(lines)) <= EXPLANATION_CHARS:
        return lines
    return [cap(lines[0], EXPLANATION_CHARS)] if keep_any else []
