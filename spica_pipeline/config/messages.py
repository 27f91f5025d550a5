"""One line per validation error: the dotted field path and the reason (CLI, Dagster and nested configs)."""

from typing import Any

from pydantic import ValidationError

from spica_pipeline.errors import one_line


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def render_validation_error(err: ValidationError) -> str:
    """`<dotted field path>: <reason>` for the first error, plus `(+N more)`."""
    errors = err.errors(include_url=False)
    first = errors[0]
    msg = str(first.get("msg", "invalid value"))
    kind = first.get("type", "")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    elif kind == "extra_forbidden":
        msg = "unknown key (not allowed here)"
    elif kind == "missing":
        msg = "field required"
    else:
        msg = msg[:1].lower() + msg[1:]
        if kind not in ("missing",) and "input" in first:
            msg += f" (got {first['input']!r})" if len(repr(first["input"])) <= 80 else ""
    path = _loc(tuple(first.get("loc", ())))
    text = f"{path}: {msg}" if path else msg
    if len(errors) > 1:
        text += f" (+{len(errors) - 1} more)"
    return one_line(text)
