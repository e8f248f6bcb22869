"""What the load generator sends: synthetic prompts, request classes
(priorities) and the OpenAI request bodies."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Common English words, each a single token (after a space) in SmolLM2's
# vocabulary and in most BPE vocabularies, so N words make about N tokens.
_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office door health person "
    "art war history party result change morning reason research girl guy moment air teacher force education "
    "river mountain garden window light music paper road tree bird horse table letter picture ocean summer "
    "winter island forest village market bridge train ship field stone glass fire rain snow wind cloud star "
    "moon sun sky sea boat king queen castle farmer baker doctor lawyer painter writer singer dancer driver "
    "pilot sailor soldier hunter keeper lamp candle clock coin key box bag cup plate bowl bread cheese apple "
    "orange lemon sugar salt milk coffee tea wine beer chair bed floor wall roof gate path hill valley lake "
    "pond beach coast desert meadow"
)
WORDS = tuple(_WORD_TEXT.split())

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def synthetic_prompt(num_tokens: int, seed: int) -> str:
    """About `num_tokens` tokens of random words. Each seed gives another
    text, so prompts share no prefix a server could cache."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(max(1, num_tokens)))


@dataclass(frozen=True, slots=True)
class RequestClass:
    """A kind of request in the mix: its name in reports, the `priority`
    field it sends (None: no field) and its share of the requests."""

    name: str
    priority: str | float | None = None
    share: float = 1.0


def parse_mix(text: str) -> tuple[RequestClass, ...]:
    """`interactive=0.2,batch=0.8` -> classes named after the priority they send."""
    classes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, share = part.partition("=")
        try:
            value = float(share) if share else 1.0
        except ValueError:
            raise ValueError(f"bad share in {part!r}: expected NAME=FRACTION") from None
        if value <= 0:
            raise ValueError(f"share of {name!r} must be positive, got {value}")
        classes.append(RequestClass(name.strip(), _priority_value(name.strip()), value))
    if not classes:
        raise ValueError("empty priority mix")
    return tuple(classes)


def _priority_value(name: str) -> str | float | None:
    if name in ("", "none"):
        return None
    try:
        return float(name)
    except ValueError:
        return name


class ClassPicker:
    """Deals classes in their exact proportions over every prefix of the
    request sequence (largest deficit first), so short runs keep the mix."""

    def __init__(self, classes: Sequence[RequestClass]) -> None:
        total = sum(c.share for c in classes)
        self.classes = tuple(classes)
        self._weights = [c.share / total for c in classes]
        self._counts = [0] * len(classes)

    def next(self) -> RequestClass:
        dealt = sum(self._counts) + 1
        deficits = [w * dealt - n for w, n in zip(self._weights, self._counts, strict=True)]
        index = max(range(len(deficits)), key=deficits.__getitem__)
        self._counts[index] += 1
        return self.classes[index]


@dataclass(frozen=True, slots=True)
class Workload:
    """The shape of every request of a run."""

    model: str
    endpoint: str = "completions"  # or "chat"
    prompt_tokens: int = 128
    output_tokens: int = 128
    fixed_output: bool = True  # ignore_eos + min_tokens: every answer is output_tokens long
    temperature: float = 0.0
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # A sampling seed per request, from the same number as its prompt: two
    # servers sent the same run sample the same text (a speed comparison of
    # sampled text is otherwise also a comparison of two random texts).
    seeded: bool = False

    @property
    def path(self) -> str:
        return ENDPOINTS[self.endpoint]

    def body(
        self,
        seed: int,
        request_class: RequestClass,
        *,
        output_tokens: int | None = None,
        prompt_tokens: int | None = None,
    ) -> dict[str, Any]:
        """The JSON body of one streamed request."""
        prompt = synthetic_prompt(prompt_tokens or self.prompt_tokens, seed)
        max_tokens = output_tokens or self.output_tokens
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.fixed_output:
            # localserve and llama-server honour ignore_eos; localserve and
            # llama_cpp.server honour min_tokens. Unknown fields are ignored.
            body["ignore_eos"] = True
            body["min_tokens"] = max_tokens
        if request_class.priority is not None:
            body["priority"] = request_class.priority
        if self.seeded and self.temperature > 0:
            body["seed"] = seed % 2**31
        body.update(self.extra_body)
        return body
