"""Constrained sampling for every backend, through one engine: llguidance.

`serving/grammar.py` turns what a request asks for (`response_format`, a
JSON schema, tools, GBNF, Lark) into one llguidance grammar, a plain string
in `SamplingParams.grammar`. Here a backend turns that string into a
`GrammarMatcher` per sequence, over an `LLTokenizer` built once per model
from the model's own vocabulary (`Tokenizer.guidance_tokenizer`).

How a backend samples with it (the same on llama.cpp and in numpy): sample
as if unconstrained, ask the matcher whether that token is allowed (a few
microseconds), and only when it is not, compute the token mask (tens of
microseconds), mask the logits and sample again. The result has exactly the
masked distribution: a token x the grammar allows is picked first with
p(x), or after a rejection (probability 1 - Z) with p(x) / Z, in all p(x) / Z,
where Z is the allowed mass. llama.cpp's `common_sampler` does the same.
A mask is then computed only for a rejected token, so there is no batch of
masks to compute ahead of a step (llguidance's thread pool, LLExecutor,
would only take cores from llama.cpp's decode on a machine of few cores).

Why llguidance rather than xgrammar (bench/structured_bench.py measures
both): it compiles a 50-property schema in about 1 ms (xgrammar 12 ms), its
masks cost about the same (30 vs 20 microseconds), it reads GBNF and Lark
with JSON schemas inside (`%json`) and token ids (`<[id]>`), which the tool
grammar needs, it builds a tokenizer from llama.cpp's vocabulary, and it
brings no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import numpy as np

from localserve.errors import InvalidRequestError

if TYPE_CHECKING:
    import llguidance

    from localserve.engine.backend import Tokenizer
    from localserve.engine.types import SamplingParams


class GrammarMatcher:
    """One sequence's grammar state: which tokens may come next."""

    __slots__ = ("_matcher", "_tokenizer", "_mask", "_eos")

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str) -> None:
        import llguidance

        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            raise InvalidRequestError(f"the grammar is not valid: {_first_line(self._matcher.get_error())}")
        self._tokenizer = tokenizer
        self._mask: np.ndarray | None = None  # the mask of the current position, once computed
        self._eos = tokenizer.eos_tokens

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more but ending."""
        return bool(self._matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        """The text so far is complete: the grammar allows ending here."""
        return bool(self._matcher.is_accepting())

    @property
    def end_token(self) -> int:
        return int(self._eos[0])

    def allows(self, token_id: int) -> bool:
        if self._mask is not None:
            allowed = self._allowed_ids_mask()
            return bool(allowed[token_id]) if token_id < len(allowed) else False
        return self._matcher.validate_tokens([token_id]) == 1

    def consume(self, token_id: int) -> None:
        """Advance past a sampled token (one `allows` said yes to, or an
        end-of-generation token once the grammar may end)."""
        self._mask = None
        if not self._matcher.consume_token(token_id):
            raise InvalidRequestError(
                f"the grammar does not allow token {token_id} here: {_first_line(self._matcher.get_error())}"
            )

    def mask_into(self, row: np.ndarray) -> None:
        """Compute the next position's mask into `row` (int32 words, one bit a token)."""
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        self._mask = row

    def ensure_mask(self) -> None:
        if self._mask is None:
            self.mask_into(np.empty(mask_words(self._tokenizer.vocab_size), dtype=np.int32))

    def apply(self, logits: np.ndarray) -> None:
        """Set the logits of the tokens the grammar forbids to -inf, in place."""
        self.ensure_mask()
        allowed = self._allowed_ids_mask()
        n = min(len(logits), len(allowed))
        logits[:n][~allowed[:n]] = -np.inf
        logits[n:] = -np.inf
        if self._matcher.is_error():
            raise InvalidRequestError(f"the grammar failed: {_first_line(self._matcher.get_error())}")

    def _allowed_ids_mask(self) -> np.ndarray:
        assert self._mask is not None
        return np.unpackbits(self._mask.view(np.uint8), bitorder="little").view(np.bool_)


class ThinkBudget:
    """Caps a reasoning model's think section (serving/reasoning.py): once
    `budget` tokens were written inside it, the closing marker's tokens are
    forced, one per sample, unless the model closed the section itself."""

    __slots__ = ("_budget", "_close", "_token_bytes", "_inside", "_count", "_tail", "_forcing")

    OPEN, CLOSE = b"<think>", b"</think>"

    def __init__(
        self, budget: int, close_ids: Sequence[int], token_bytes: Callable[[int], bytes], *, opened: bool
    ) -> None:
        self._budget = budget
        self._close = tuple(close_ids)
        self._token_bytes = token_bytes
        self._inside: bool | None = opened  # None once the section is over
        self._count = 0
        self._tail = b""
        self._forcing = 0  # close tokens forced so far

    def forced(self) -> int | None:
        """The token to write now instead of sampling, if any."""
        if self._inside is not True or self._count < self._budget:
            return None
        token = self._close[self._forcing]
        self._forcing += 1
        if self._forcing == len(self._close):
            self._inside = None
        return token

    def note(self, token_id: int) -> None:
        """A token the model wrote (or that was forced)."""
        if self._inside is None:
            return
        self._tail = (self._tail + self._token_bytes(token_id))[-32:]
        if self._inside:
            self._count += 1
            if self.CLOSE in self._tail:
                self._inside = None
        elif self.OPEN in self._tail:
            self._inside, self._tail = True, self._tail[self._tail.index(self.OPEN) + len(self.OPEN) :]
        elif (start := self._tail.lstrip()) and not self.OPEN.startswith(start):
            self._inside = None  # the answer began without a think section ("<th" may still become one)


def think_budget(params: SamplingParams, tokenizer: Tokenizer) -> ThinkBudget | None:
    if params.think_budget is None:
        return None
    close = tokenizer.encode(f"\n{ThinkBudget.CLOSE.decode()}\n\n", add_special=False, parse_special=True)
    return ThinkBudget(params.think_budget, close, tokenizer.token_bytes, opened=params.think_opened)


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def build_tokenizer_from_json(
    tokenizer_json: str, n_vocab: int, eos_token_ids: Collection[int]
) -> llguidance.LLTokenizer:
    """An LLTokenizer from a Hugging Face `tokenizer.json`'s text."""
    import llguidance

    return llguidance.LLTokenizer(tokenizer_json, n_vocab=n_vocab, eos_token=sorted(eos_token_ids))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"
