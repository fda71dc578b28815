"""The one Markdown escaping rule of every report.md.

The Kubeflow UI renders a task's Markdown summary, so any text that comes from data (ids, file names, URIs,
verdicts, labels, error messages) must show as text: no HTML (`<img onerror=...>`), no links, and no pipe or
line break that would split a table cell. A renderer either escapes each value it writes (`escape`) or is
declared with `@markdown_report`, which hands it a copy of the report whose every string is escaped. Text shown
verbatim (a JSON config, a lineage chain, a Mermaid graph) goes in a `fence` that no line of it can close: inside,
Markdown shows HTML as text, and entities would show literally.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["escape", "escaped", "fence", "markdown_report"]

# One pass (str.translate), so the entities it writes are never escaped again. Entities rather than backslash
# escapes: a renderer that prints a value's repr() (a dict, a quoted setting) doubles backslashes, and `\\|` would
# end a table cell; `&#124;` survives repr() and GFM splits cells before it decodes entities.
_ESCAPES = str.maketrans({
    "&": "&amp;", "<": "&lt;", ">": "&gt;",  # no HTML
    "|": "&#124;", "\\": "&#92;",  # no cell break
    "[": "&#91;", "]": "&#93;", "`": "&#96;",  # no links, images or code spans made of data
    "\n": " ", "\r": " ",  # a table row is one line
})


def escape(value: object) -> str:
    """`value` as Markdown text that renders as itself, inside a table cell or not."""
    return str(value).translate(_ESCAPES)


def escaped(value: Any) -> Any:
    """A copy of `value` with every string (mapping keys included) escaped; numbers, booleans and None kept."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, Mapping):
        return {escaped(k) if isinstance(k, str) else k: escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escaped(v) for v in value]
    return value


def fence(text: str, info: str = "") -> str:
    """`text` as a fenced code block (`info`: its language): the fence is one backtick longer than the longest run of
    backticks in `text` (three at least), so no line of it ends the block (CommonMark: a closing fence is at least
    as long as the opening one)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    bar = "`" * max(3, longest + 1)
    return "\n".join([bar + info, text.rstrip("\n"), bar])


R = TypeVar("R", bound=Callable[..., str])


def markdown_report(render: R) -> R:
    """Declare a report renderer whose report values all come out escaped (its own template text is not)."""

    @functools.wraps(render)
    def wrapper(report: Mapping[str, Any], *args: Any, **kwargs: Any) -> str:
        return render(escaped(report), *args, **kwargs)

    return wrapper  # type: ignore[return-value]
