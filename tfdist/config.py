"""Validated options and the one way tfdist words a bad-argument error.

Every user-facing check in tfdist raises through :func:`invalid_argument`, so
messages read alike: the argument's name, what was received, what was expected.
"""
from __future__ import annotations

from typing import Any, Iterable

PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def invalid_argument(name: str, received: Any, expected: str | Iterable[str], *, note: str = "") -> ValueError:
    """Builds the Keras-style error for a bad argument.

    Args:
        name: The argument's name, e.g. ``strategy`` or ``TF_CONFIG.task.index``.
        received: The value that was passed.
        expected: A sentence, or an iterable of the valid names.
        note: An optional sentence appended to the message (a hint or a fix).

    Returns:
        A ``ValueError`` to raise. Its text reads
        "Invalid value for argument `name`. Received: name=... Expected ...".
    """
    if not isinstance(expected, str):
        expected = "one of: " + ", ".join(str(e) for e in expected)
    msg = f"Invalid value for argument `{name}`. Received: {name}={received!r}. Expected {expected}."
    if note:
        msg += " " + note
    return ValueError(msg)


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Returns ``value`` if it is one of ``choices``, else raises the standard error."""
    choices = tuple(choices)
    if value not in choices:
        raise invalid_argument(name, value, sorted(choices))
    return value


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    """Returns ``value`` if it is an int >= 1 (or None when allowed), else raises."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid_argument(name, value, "a positive integer" + (" or None" if allow_none else ""))
    return value
