"""How long idle models stay loaded and how many of each kind may be: the
parsing of `keep_alive` (Ollama's semantics) and `--max-loaded-models`.

Light on purpose (no backends, no aiohttp): the CLI parses its flags with it.
"""

from __future__ import annotations

import math
import re

from localserve.errors import InvalidRequestError
from localserve.models.kinds import ModelKind

#: `--max-loaded-models` names a limit by its kind; "asr" is transcription too.
_KIND_NAMES = {**{kind.value: kind for kind in ModelKind}, "asr": ModelKind.TRANSCRIPTION}

FOREVER = math.inf
DEFAULT_MAX_LOADED = 3  # Ollama's default per device
DEFAULT_ON_DEMAND_KEEP_ALIVE_S = 300.0  # Ollama's default: 5m

_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_MAX_DURATION_CHARS = 64


def parse_keep_alive(value: str | float | int | None, *, param: str = "keep_alive") -> float | None:
    """Seconds to keep a model loaded once idle, as Ollama reads `keep_alive`:
    a number of seconds (`300`, `"300"`), a Go duration (`"5m"`, `"1h30m"`,
    `"500ms"`), 0 to unload right after the request, any negative value to
    keep it forever (`math.inf`). None (or "") means "not given"."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):  # bool is an int: refuse `true`
        raise _bad_duration(value, param)
    seconds = float(value) if isinstance(value, int | float) else _parse_duration_text(value.strip(), param)
    if math.isnan(seconds):
        raise _bad_duration(value, param)
    return FOREVER if seconds < 0 else seconds


def _parse_duration_text(text: str, param: str) -> float:
    if len(text) > _MAX_DURATION_CHARS:
        raise _bad_duration(text, param)
    try:
        return float(text)  # a bare number: seconds
    except ValueError:
        pass
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(body):
        if match.start() != position:
            raise _bad_duration(text, param)
        total += float(match.group(1)) * _UNITS_S[match.group(2)]
        position = match.end()
    if position == 0 or position != len(body):
        raise _bad_duration(text, param)
    return sign * total


def _bad_duration(value: object, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f'invalid {param} {value!r}: give seconds (300), a duration ("5m", "1h30m", "30s"), '
        "0 to unload right after the request, or -1 to keep the model loaded",
        param=param,
    )


def format_keep_alive(seconds: float | None) -> str:
    """`"forever"`, `"0s"`, `"5m"`, `"90s"`: for logs and listings."""
    if seconds is None:
        return "default"
    if seconds == FOREVER:
        return "forever"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def parse_max_loaded_models(text: str) -> dict[ModelKind, int]:
    """`"3"` (every kind) or `"chat=2,embeddings=1,asr=1"` (kinds not named
    keep the default; `asr` or `transcription`); 0 means no limit for that kind."""
    text = text.strip()
    limits = dict.fromkeys(ModelKind, DEFAULT_MAX_LOADED)
    if not text:
        return limits
    if "=" not in text:
        return dict.fromkeys(ModelKind, _non_negative_int(text, text))
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, number = (s.strip() for s in part.partition("="))
        kind = _KIND_NAMES.get(name.lower())
        if not sep or kind is None:
            raise ValueError(f"expected N or KIND=N[,KIND=N] with KIND one of chat, embeddings, asr; got {part!r}")
        limits[kind] = _non_negative_int(number, text)
    return limits


def _non_negative_int(number: str, text: str) -> int:
    try:
        value = int(number)
    except ValueError:
        raise ValueError(f"expected a whole number of models, got {text!r}") from None
    if value < 0:
        raise ValueError(f"a number of models cannot be negative: {text!r}")
    return value
