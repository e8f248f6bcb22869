"""One answer in flight: its engine requests (n choices of one or more
prompts) and what they produce, streamed as typed deltas or collected whole.

`submit()` queues the requests; the `Answer` it returns must be left through
`async with answer:` (or `abort()`): whatever still runs is then aborted
before the next step, so a client who leaves stops the generation.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType

from localserve.engine.backend import Tokenizer
from localserve.engine.types import FinishReason, SamplingParams, TokenEvent, TokenLogprob
from localserve.errors import ContextLengthError
from localserve.serving.generation import MergedStreams, event_error, submit_all
from localserve.serving.models import ChatModel
from localserve.serving.reasoning import REASONING, ReasoningFormat, ReasoningParser, split_reasoning
from localserve.serving.sampling import check_logit_bias, per_choice, sampling_for, validate
from localserve.serving.tools import ToolPlan
from localserve.serving.tools_parse import Delta as ParserDelta
from localserve.serving.tools_parse import ToolCallParser, parse_reply
from localserve.serving.types import (
    ChoiceEnd,
    ChoiceResult,
    Delta,
    Options,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)


async def submit(
    model: ChatModel,
    answer_id: str,
    prompts: Sequence[list[int]],
    options: Options,
    *,
    grammar: str | None = None,
    grammar_param: str = "response_format",
    plan: ToolPlan | None = None,
    prompt_param: str,
    truncated: bool = False,
    reasoning: ReasoningFormat | None = None,
) -> Answer:
    """Queue `options.num_choices` requests per prompt (choice `p * n + i` is
    choice i of prompt p); all or none."""
    check_logit_bias(options.sampling, model.tokenizer.vocab_size)
    choices: list[tuple[list[int], SamplingParams]] = []
    for prompt_ids in prompts:
        _check_fits(prompt_ids, model.n_ctx, prompt_param)
        params = sampling_for(options, num_prompt_tokens=len(prompt_ids), n_ctx=model.n_ctx, grammar=grammar)
        choices.extend((prompt_ids, per_choice(params, i)) for i in range(options.num_choices))
    if grammar is not None:
        await validate(model.engine.backend(model.model_id), choices[0][1], param=grammar_param)
    streams = submit_all(
        model.engine, model.model_id, answer_id, choices, priority=options.priority, prompt_param=prompt_param
    )
    stops = options.sampling.stop
    return Answer(
        model, answer_id, MergedStreams(streams), list(prompts), options.num_choices, plan, stops, truncated, reasoning
    )


def _check_fits(prompt_ids: list[int], n_ctx: int, param: str) -> None:
    """A prompt the context cannot hold: the 400 says both counts, as
    llama-server's `exceed_context_size_error` (the engine refuses it too)."""
    if len(prompt_ids) >= n_ctx:
        raise ContextLengthError(
            f"This model's maximum context length is {n_ctx} tokens; the prompt has {len(prompt_ids)} tokens. "
            "Shorten the prompt or restart with a larger --ctx-size.",
            param=param,
            n_prompt_tokens=len(prompt_ids),
            n_ctx=n_ctx,
        )


class ChoiceStream:
    """One choice's engine events as typed deltas: text, or with tools the
    calls read out of it (`ToolCallParser`), and a `ChoiceEnd` last. Keeps
    the choice's output token ids and when its first token came."""

    def __init__(
        self,
        index: int,
        *,
        tools: bool,
        stops: tuple[str, ...] = (),
        tokenizer: Tokenizer | None = None,
        reasoning: ReasoningFormat | None = None,
    ) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self.first_token_ns = 0
        self.num_cached_tokens = 0  # of the prompt, as the first token's event told
        self.parser = ToolCallParser() if tools else None
        self.thinking = ReasoningParser(reasoning) if reasoning is not None else None
        self._stops = stops
        self._tokenizer = tokenizer
        self.closed = False  # its ChoiceEnd went out

    def note(self, event: TokenEvent) -> None:
        """Count an event's tokens (every event goes through here)."""
        if event.token_ids:
            if not self.first_token_ns:
                self.first_token_ns = time.monotonic_ns()
                self.num_cached_tokens = event.num_cached_tokens
            self.token_ids.extend(event.token_ids)

    def deltas(self, event: TokenEvent) -> list[Delta]:
        """What a (noted) event adds; a failed step ends with its error."""
        index, parser = self.index, self.parser
        if event.finish_reason is FinishReason.ERROR:
            return [ChoiceEnd(index, FinishReason.ERROR.value, _usage(event), error=event_error(event))]
        out: list[Delta] = []
        if self.thinking is None:
            out += self._content(event.text, event.logprobs)
        else:
            logprobs = event.logprobs
            for kind, text in self.thinking.feed(event.text):
                out += [ReasoningDelta(index, text, logprobs)] if kind == REASONING else self._content(text, logprobs)
                logprobs = ()
            if logprobs:
                out.append(TextDelta(index, "", logprobs))
        if event.finish_reason is not None:
            num_calls = 0
            for kind, text in self.thinking.finish() if self.thinking is not None else ():
                out += [ReasoningDelta(index, text)] if kind == REASONING else self._content(text, ())
            reason = event.finish_reason.value
            if parser is not None:
                out += _typed(index, parser, parser.finish(), ())
                num_calls = parser.num_complete
                if num_calls and event.finish_reason is FinishReason.LENGTH:
                    reason = FinishReason.STOP.value  # complete calls came first: a cut-off one is dropped
            stop = self.stop_sequence(event)
            out.append(ChoiceEnd(index, reason, _usage(event), num_calls, stop))
            self.closed = True
        return out

    @property
    def repeated_call(self) -> bool:
        """The model started a call identical to an earlier one: the choice is over."""
        return self.parser is not None and self.parser.repeated

    def end_early(self, num_prompt_tokens: int) -> ChoiceEnd:
        """The choice's end when its last call repeated an earlier one."""
        self.closed = True
        calls = self.parser.num_complete if self.parser is not None else 0
        return ChoiceEnd(self.index, FinishReason.STOP.value, Usage(num_prompt_tokens, len(self.token_ids)), calls)

    def _content(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> list[Delta]:
        """The answer's text (tool calls read out of it, with tools)."""
        if self.parser is not None:
            return _typed(self.index, self.parser, self.parser.feed(text), logprobs)
        return [TextDelta(self.index, text, logprobs)] if text or logprobs else []

    def stop_sequence(self, event: TokenEvent) -> str | None:
        """The stop string that ended the choice, if one did. The engine keeps
        an end-of-generation token out of its event, so a "stop" whose event
        carries tokens was a stop string: the one found in the last tokens."""
        if event.finish_reason is not FinishReason.STOP or not event.token_ids or not self._stops:
            return None
        if len(self._stops) == 1 or self._tokenizer is None:
            return self._stops[0]
        tail = self._tokenizer.decode(self.token_ids[-(max(len(s) for s in self._stops) + 4) :])
        found = [(position, stop) for stop in self._stops if (position := tail.find(stop)) != -1]
        return min(found)[1] if found else None


class Answer:
    """See the module docstring. `prompt_ids` holds each prompt's token ids;
    `truncated` says a fill-in-the-middle prompt was cut to fit."""

    def __init__(
        self,
        model: ChatModel,
        answer_id: str,
        merged: MergedStreams,
        prompt_ids: list[list[int]],
        num_choices_per_prompt: int,
        plan: ToolPlan | None,
        stops: tuple[str, ...],
        truncated: bool,
        reasoning: ReasoningFormat | None = None,
    ) -> None:
        self.id = answer_id
        self.model = model
        self.prompt_ids = prompt_ids
        self.num_choices_per_prompt = num_choices_per_prompt
        self.plan = plan
        self.truncated = truncated
        self.reasoning = reasoning
        self.submitted_ns = time.monotonic_ns()
        self._merged = merged
        self._choices = [
            ChoiceStream(i, tools=plan is not None, stops=stops, tokenizer=model.tokenizer, reasoning=reasoning)
            for i in range(len(merged.streams))
        ]

    @property
    def model_id(self) -> str:
        return self.model.model_id

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer

    @property
    def num_choices(self) -> int:
        return len(self._choices)

    def first_token_ns(self, index: int) -> int:
        """`time.monotonic_ns()` at choice `index`'s first token (0: none yet)."""
        return self._choices[index].first_token_ns

    def num_cached_tokens(self, index: int) -> int:
        """Prompt tokens of choice `index` reused from the prefix cache (known at its first token)."""
        return self._choices[index].num_cached_tokens

    def num_prompt_tokens(self, index: int) -> int:
        """The length of choice `index`'s prompt."""
        return self._num_prompt_tokens(index)

    def token_ids(self, index: int) -> list[int]:
        """The output token ids of choice `index` so far."""
        return self._choices[index].token_ids

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()

    def abort(self) -> None:
        """Stop every request of the answer still running."""
        self._merged.abort()
        self.model.host.note_output(sum(len(choice.token_ids) for choice in self._choices))

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        """The engine's events as they come, `(choice index, event)`."""
        async for index, event in self._merged:
            self._choices[index].note(event)
            yield index, event

    async def deltas(self) -> AsyncIterator[Delta]:
        """The answer as typed deltas, in arrival order: text (or, with tools,
        tool-call pieces) and a `ChoiceEnd` per choice. A choice that fails
        ends with finish reason "error" and its `error`, and the stream stops
        there (the rest is aborted)."""
        try:
            async for index, event in self.events():
                choice = self._choices[index]
                for delta in choice.deltas(event):
                    yield delta
                if event.finish_reason is FinishReason.ERROR:
                    return
                if choice.repeated_call and not choice.closed:
                    self._merged.end(index)
                    yield choice.end_early(self._num_prompt_tokens(index))
        finally:
            self.abort()

    def _num_prompt_tokens(self, index: int) -> int:
        return len(self.prompt_ids[index // self.num_choices_per_prompt])

    async def collect(self) -> list[ChoiceResult]:
        """Run the answer to the end. A failed choice fails the whole answer
        (500, or 503 when ended by a shutdown); the others are aborted."""
        results = [ChoiceResult(i) for i in range(self.num_choices)]
        try:
            async for index, event in self.events():
                if event.finish_reason is FinishReason.ERROR:
                    raise event_error(event)
                result = results[index]
                result.text += event.text
                result.logprobs.extend(event.logprobs)
                choice = self._choices[index]
                if event.finish_reason is not None:
                    result.finish_reason = event.finish_reason.value
                    result.usage = _usage(event)
                    result.stop_sequence = choice.stop_sequence(event)
                elif choice.parser is not None and self.reasoning is None:
                    choice.parser.feed(event.text)  # only to notice a repeated call as it starts
                    if choice.parser.repeated:
                        self._merged.end(index)
                        result.finish_reason = FinishReason.STOP.value
                        result.usage = Usage(self._num_prompt_tokens(index), len(choice.token_ids))
        finally:
            self.abort()
        for result, choice in zip(results, self._choices, strict=True):
            result.token_ids = choice.token_ids
            result.reasoning, answer_text = split_reasoning(result.text, self.reasoning)
            if self.plan is None:
                result.content = answer_text
            else:
                reply = parse_reply(answer_text)
                result.content, result.tool_calls = reply.content, reply.calls
                if reply.calls and result.finish_reason == FinishReason.LENGTH.value:
                    result.finish_reason = FinishReason.STOP.value  # the cut-off call is dropped
        return results


def _usage(event: TokenEvent) -> Usage:
    return Usage(
        event.num_prompt_tokens,
        event.num_output_tokens,
        event.num_cached_tokens,
        event.num_draft_tokens,
        event.num_accepted_tokens,
    )


def _typed(
    index: int, parser: ToolCallParser, deltas: list[ParserDelta], logprobs: tuple[TokenLogprob, ...]
) -> list[Delta]:
    """The parser's deltas as typed ones; the event's log-probabilities go
    with the first delta that carries text."""
    out: list[Delta] = []
    for d in deltas:
        if d.content:
            out.append(TextDelta(index, d.content, logprobs))
        elif d.name:
            out.append(ToolCallStart(index, d.index, d.call_id, d.name, logprobs))
        elif d.arguments:
            out.append(ToolCallArguments(index, d.index, d.arguments, logprobs))
        elif d.done:
            out.append(ToolCallEnd(index, d.index, parser.calls[d.index].whole()))
            continue
        else:
            continue
        logprobs = ()
    return out
