"""llama.cpp's `/completion` and `/infill` answers as llama-server gives them
(`InfillRun`, one per prompt): the text with its `n_indent` and
`t_max_predict_ms` limits, the counts, the timings and the result object
(`stop_type`, `tokens_predicted`, `timings`, ...)."""

from __future__ import annotations

import math
import time
from typing import Any

from localserve.engine.backend import Tokenizer
from localserve.engine.types import FinishReason, TokenEvent, TokenLogprob
from localserve.serving.generation import event_error
from localserve.serving.llamacpp.bias import reported
from localserve.serving.llamacpp.request import LlamaParams
from localserve.serving.timings import llama_timings, prompt_progress


class LineLimits:
    """llama.cpp's `n_indent` rule on streamed text: after the first newline,
    hold each new line's leading whitespace until its first character shows
    whether the line is indented enough."""

    def __init__(self, n_indent: int) -> None:
        self.n_indent = n_indent
        self.pending = ""
        self.at_line_start = False
        self.has_new_line = False
        self.cut = False

    def push(self, text: str) -> str:
        """The text that may be released; sets `cut` when a line is too shallow."""
        self.pending += text
        released = ""
        while self.pending and not self.cut:
            if self.at_line_start and self.n_indent > 0:
                width = len(self.pending) - len(self.pending.lstrip(" \t"))
                if width == len(self.pending):
                    break  # only whitespace so far
                if width < self.n_indent:
                    released += self.pending[:width]
                    self.pending, self.cut = "", True
                    break
            self.at_line_start = False
            newline = self.pending.find("\n")
            if newline == -1:
                released += self.pending
                self.pending = ""
                break
            released += self.pending[: newline + 1]
            self.pending = self.pending[newline + 1 :]
            self.at_line_start = self.has_new_line = True
        return released

    def flush(self) -> str:
        released, self.pending = self.pending, ""
        return released


class InfillRun:
    """One infill answer: text, limits, counts and llama.cpp's result object."""

    def __init__(
        self,
        body: LlamaParams,
        model_id: str,
        truncated: bool,
        n_ctx: int,
        prompt_text: str,
        *,
        index: int = 0,
        tokenizer: Tokenizer | None = None,
        n_predict: int | None = None,
        logit_bias: tuple[tuple[int, float], ...] = (),
    ) -> None:
        self.body = body
        self.logit_bias = logit_bias
        self.n_predict = body.n_predict if n_predict is None else n_predict  # the server's --n-predict may cap it
        self.index = index
        self.tokenizer = tokenizer  # for `n_probs`
        self.probs: list[dict[str, Any]] = []
        self.model_id = model_id
        self.truncated = truncated
        self.n_ctx = n_ctx
        self.prompt_text = prompt_text
        self.lines = LineLimits(body.n_indent)
        self.content = ""
        self.token_ids: list[int] = []
        self.started_at = time.monotonic()
        self.first_token_at = 0.0
        self.final: TokenEvent | None = None
        self.stop_type = "none"
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.progress_sent = False

    @property
    def stopped(self) -> bool:
        return self.stop_type != "none"

    def add(self, event: TokenEvent) -> str:
        """Take one event; return the text it releases."""
        if event.finish_reason is FinishReason.ERROR:
            raise event_error(event)
        now = time.monotonic()
        if event.token_ids:
            self.token_ids.extend(event.token_ids)
            if self.tokenizer is not None and self.body.n_probs:
                self.probs.extend(
                    token_probs(self.tokenizer, p, as_probs=self.body.post_sampling_probs) for p in event.logprobs
                )
            self.first_token_at = self.first_token_at or now
        self.num_prompt_tokens = event.num_prompt_tokens or self.num_prompt_tokens
        self.num_cached_tokens = event.num_cached_tokens or self.num_cached_tokens
        if event.finished:
            self.final = event
        piece = self.lines.push(event.text)
        if self.lines.cut:
            self.stop_type = "limit"
        elif self._out_of_time(now):
            piece += self.lines.flush()
            self.stop_type = "limit"
        elif event.finished:
            piece += self.lines.flush()
            self.stop_type = _stop_type(event)
        self.content += piece
        return piece

    def _out_of_time(self, now: float) -> bool:
        limit_ms = self.body.t_max_predict_ms
        return limit_ms > 0 and self.lines.has_new_line and (now - self.first_token_at) * 1000 > limit_ms

    def partial(self, piece: str, num_probs: int = 0) -> dict[str, Any]:
        """A streamed event with `piece`, and the probabilities of the last `num_probs` tokens."""
        out: dict[str, Any] = {
            "index": self.index,
            "content": piece,
            "tokens": [],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": len(self.token_ids),
            "tokens_evaluated": self.num_prompt_tokens,
        }
        if self.body.n_probs and num_probs:
            out["completion_probabilities"] = self.probs[-num_probs:]
        if self.body.timings_per_token:
            out["timings"] = self.timings()
        return out

    def progress(self) -> list[dict[str, Any]]:
        """`return_progress`'s events, sent before the first token's: the
        cached part of the prompt, then the whole prompt done (the engine
        tells both at the first token, and nothing between)."""
        self.progress_sent = True
        total, cache = self.num_prompt_tokens, self.num_cached_tokens
        start = self.partial("")
        start["prompt_progress"] = prompt_progress(total=total, cache=cache, processed=cache, time_ms=0.0)
        start["timings"] = llama_timings(prompt_n=0, cache_n=cache, prompt_ms=0.0, predicted_n=0, predicted_ms=0.0)
        done = self.partial("")
        prompt_ms = ((self.first_token_at or time.monotonic()) - self.started_at) * 1000
        done["prompt_progress"] = prompt_progress(total=total, cache=cache, processed=total, time_ms=prompt_ms)
        done["timings"] = llama_timings(
            prompt_n=total - cache, cache_n=cache, prompt_ms=prompt_ms, predicted_n=0, predicted_ms=0.0
        )
        return [start, done]

    def timings(self) -> dict[str, Any]:
        """llama-server's `timings` so far: the prompt until the first token, the rest since."""
        end = time.monotonic()
        first = self.first_token_at or end
        return llama_timings(
            prompt_n=max(0, self.num_prompt_tokens - self.num_cached_tokens),
            cache_n=self.num_cached_tokens,
            prompt_ms=(first - self.started_at) * 1000,
            predicted_n=len(self.token_ids),
            predicted_ms=(end - first) * 1000,
        )

    def _banned_ids(self) -> frozenset[int]:
        """The end-of-generation tokens `ignore_eos` bans."""
        return self.tokenizer.eog_token_ids if self.body.ignore_eos and self.tokenizer is not None else frozenset()

    def result(self, *, streamed: bool = False) -> dict[str, Any]:
        """llama.cpp's final result object (content empty when streamed)."""
        num_cached = self.num_cached_tokens
        predicted_n = len(self.token_ids)
        body = self.body
        out: dict[str, Any] = {
            "index": self.index,
            "content": "" if streamed else self.content,
            "tokens": [] if streamed or not body.return_tokens else self.token_ids,
            "id_slot": -1,
            "stop": True,
            "model": self.model_id,
            "tokens_predicted": predicted_n,
            "tokens_evaluated": self.num_prompt_tokens,
            "generation_settings": {
                "n_ctx": self.n_ctx,
                "n_predict": self.n_predict,
                "temperature": body.temperature,
                "top_k": body.top_k,
                "top_p": body.top_p,
                "min_p": body.min_p,
                "seed": body.seed if body.seed is not None else -1,
                "stop": body.stop,
                "n_indent": body.n_indent,
                "t_max_predict_ms": body.t_max_predict_ms,
                "ignore_eos": body.ignore_eos,
                "logit_bias": reported(self.logit_bias, self._banned_ids()),
            },
            "prompt": self.prompt_text,
            "has_new_line": self.lines.has_new_line,
            "truncated": self.truncated,
            "stop_type": self.stop_type,
            "stopping_word": body.stop[0] if self.stop_type == "word" and len(body.stop) == 1 else "",
            "tokens_cached": num_cached,
            "timings": self.timings(),
        }
        if body.n_probs and not streamed:
            out["completion_probabilities"] = self.probs
        return _select(out, body.response_fields) if body.response_fields else out


def token_probs(tokenizer: Tokenizer, logprob: TokenLogprob, *, as_probs: bool = False) -> dict[str, Any]:
    """One token of llama-server's `completion_probabilities`; `as_probs`
    (its `post_sampling_probs`): `prob` and `top_probs` instead of
    `logprob` and `top_logprobs`, the model's probabilities (not those the
    sampler chain renormalized: llama-server's differ there)."""
    key = "prob" if as_probs else "logprob"

    def entry(token_id: int, value: float) -> dict[str, Any]:
        piece = tokenizer.token_bytes(token_id)
        text = piece.decode("utf-8", errors="replace")
        return {"id": token_id, "token": text, "bytes": list(piece), key: math.exp(value) if as_probs else value}

    out = entry(logprob.token_id, logprob.logprob)
    top = [entry(token_id, value) for token_id, value in logprob.top]
    out["top_probs" if as_probs else "top_logprobs"] = [e for e in top if e[key] > 0] if as_probs else top
    return out


def _stop_type(event: TokenEvent) -> str:
    if event.finish_reason is FinishReason.STOP:
        # The engine keeps an end-of-generation token out of the event; a
        # stop string ends an event that carries its token.
        return "word" if event.token_ids else "eos"
    return "limit" if event.finish_reason is FinishReason.LENGTH else "none"


def _select(result: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama.cpp's `response_fields`: keep these (`a/b` reaches into objects)."""
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = result
        for part in path.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out[path] = value
    return out
