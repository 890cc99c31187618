"""Making text from workers, records and logs inert before it reaches an operator.

Anything a worker prints, or anyone who can write to name-resolve (a shared directory,
an etcd without authentication) stores, may end up in ``corral top``, ``corral ps``,
``corral logs`` or the dashboard. Rendered as it is, ``\\x1b]0;PWNED\\x07\\x1b[2J`` retitles
and clears the operator's terminal, ``[link=...]`` becomes a rich link, and ``x[/]`` crashes
``top``. Every such string goes through :func:`text` (one line: every control character
escaped, as ``\\x1b``), :func:`lines` (many lines: the same but newlines and tabs kept) or
:func:`deep` (every string in a JSON-like value), and rich gets it as a ``Text`` (never
markup), or escaped with :func:`markup`. The dashboard puts strings in the page only as
``textContent`` (never HTML) and gets the snapshot through :func:`deep` as well.
"""

from __future__ import annotations

import re

#: C0 and C1 controls, DEL, and the Unicode bidirectional overrides and isolates (which
#: can make a line read backwards)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
MAX_DEPTH = 32


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def text(value: object) -> str:
    """``value`` as one inert line: every control character (newlines too) escaped."""
    if not isinstance(value, str):
        value = "" if value is None else str(value)
    return _CONTROL.sub(_escape, value)


def lines(value: object) -> str:
    """Like :func:`text`, but newlines, carriage returns and tabs stay (log output)."""
    if not isinstance(value, str):
        value = "" if value is None else str(value)
    return _CONTROL_KEEP_LINES.sub(_escape, value)


def markup(value: object) -> str:
    """:func:`text`, escaped for rich markup (for strings placed inside markup)."""
    from rich.markup import escape

    return escape(text(value))


def deep(value: object, depth: int = 0) -> object:
    """Every string in a JSON-like value made inert (keys too); a log tail keeps its lines.
    Deeper than ``MAX_DEPTH``: replaced by ``"..."``."""
    if isinstance(value, str):
        return text(value)
    if depth > MAX_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {
            text(k): lines(v) if k == "log_tail" and isinstance(v, str) else deep(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [deep(v, depth + 1) for v in value]
    return value
