"""Text that is valid JSON but not Unicode: a lone UTF-16 surrogate.

JSON may escape any UTF-16 code unit, so `"\\ud800"` alone parses to a Python
string that no UTF-8 encoder (tokenizers, grammars, logs) accepts.
`check_unicode` finds the first such string in a parsed body and raises a
400 naming its field. `api.middleware.parse_body` runs it on every JSON
body that could hold one; the request models of `api.openai.schemas` run it too,
for bodies that do not come over HTTP (Batch API lines).
"""

from __future__ import annotations

import re
from typing import Any

from localserve.errors import NotUnicodeError

# A proper pair parses to one character; what is left in the surrogate range is a lone half.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


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
