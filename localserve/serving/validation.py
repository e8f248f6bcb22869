"""What every request body is checked for, over HTTP or not (Batch API
lines): text that is Unicode, and pydantic's errors as a readable 400.

Text that is valid JSON but not Unicode: a lone UTF-16 surrogate. JSON may
escape any UTF-16 code unit, so `"\\ud800"` alone parses to a Python string
that no UTF-8 encoder (tokenizers, grammars, logs) accepts. `check_unicode`
finds the first such string in a parsed body and raises a 400 naming its
field. `api.middleware.parse_body` runs it on every JSON body that could hold
one; the request models of `serving.openai.schemas` run it too, for bodies
that do not come over HTTP.

`from_validation_error` turns the first problem pydantic found into an
`InvalidRequestError` whose `param` is the field's path (`messages[0].role`).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from localserve.errors import InvalidRequestError, NotUnicodeError

# A proper pair parses to one character; what is left in the surrogate range is a lone half.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")

# pydantic names the members of a union in an error's location ("str",
# "list[str]", "function-after[...]"); they are not part of the field path.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|dict|list|bytes)$|[\[\-]")


def check_unicode(data: Any) -> None:
    """400 naming the first string (value or key) of `data` that holds a lone
    UTF-16 surrogate. Iterative: the JSON may nest as deep as the parser allows."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in reversed(value.items()):
                if isinstance(key, str) and _SURROGATE.search(key):
                    raise _surrogate_error((*path, key))
                stack.append(((*path, key), item))
        elif isinstance(value, list | tuple):  # a tuple: a body built in Python rather than parsed
            stack.extend(((*path, index), item) for index, item in reversed(list(enumerate(value))))
        elif isinstance(value, str) and _SURROGATE.search(value):
            raise _surrogate_error(path)


def _surrogate_error(path: tuple[Any, ...]) -> NotUnicodeError:
    param = json_path(path)
    return NotUnicodeError(
        f"Invalid value for '{param}': the text holds a lone UTF-16 surrogate (an escape such as \\ud800 "
        "without its pair), which is not valid Unicode. Send UTF-8 text.",
        param=param,
    )


def json_path(path: tuple[Any, ...]) -> str:
    """`("messages", 0, "content")` -> `"messages[0].content"`; a key that is
    not Unicode itself shows with backslash escapes."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = str(part).encode("utf-8", "backslashreplace").decode("utf-8")
            text += f".{name}" if text else name
    return text or "body"


def field_path(loc: tuple[int | str, ...]) -> str | None:
    """`("messages", 0, "content")` -> `"messages[0].content"`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _UNION_TAG.search(part):
            path += f".{part}" if path else part
    return path or None


def from_validation_error(exc: ValidationError) -> InvalidRequestError:
    """The first problem of a pydantic error, as a readable 400."""
    first = exc.errors(include_url=False)[0]
    param = field_path(tuple(first["loc"]))
    if first["type"] == "missing":
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    detail = str(first["msg"]).removeprefix("Value error, ")
    message = f"Invalid value for '{param}': {detail}" if param else f"Invalid request: {detail}"
    return InvalidRequestError(message, param=param)
