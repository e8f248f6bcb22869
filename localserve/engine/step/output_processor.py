"""Output processing: the step of the step loop after `Scheduler.update`.

It turns what a step sampled for each sequence into the client's
`TokenEvent`: detokenization (`OutputText`: UTF-8-safe, holds back text that
may begin a stop string) and the end of a sequence (end-of-generation token,
stop token ids, stop strings, `max_tokens`, the context). It changes no
scheduler state: it says which tokens each sequence keeps and which
sequences a stop ended, and `Scheduler.append_outputs` applies that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from localserve.engine.step.output import OutputText
from localserve.engine.step.sequence import Sequence
from localserve.engine.types import FinishReason, SampledToken, TokenEvent, TokenLogprob


@dataclass(frozen=True, slots=True)
class SeqOutput:
    """What one step gave one sequence: the tokens it sampled, in order (one,
    or more after accepted drafts), or the error the backend refused it with."""

    seq: Sequence
    sampled: tuple[SampledToken, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessedOutput:
    """The output processor's verdict on one `SeqOutput`: the tokens `seq`
    keeps (up to the one that ended it), why it ended (None: it goes on), and
    the event its client gets."""

    seq: Sequence
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    event: TokenEvent


class OutputProcessor:
    """Detokenizes sampled tokens and detects stops, for one model."""

    def __init__(self, *, eog_token_ids: Iterable[int], token_bytes: Callable[[int], bytes], n_ctx: int) -> None:
        self._eog = frozenset(eog_token_ids)
        self._token_bytes = token_bytes
        self._n_ctx = n_ctx

    def process(self, outputs: Iterable[SeqOutput]) -> list[ProcessedOutput]:
        return [self._process(output) for output in outputs]

    def _process(self, output: SeqOutput) -> ProcessedOutput:
        """Take the sampled tokens in order until one ends the sequence; one event for them all."""
        seq = output.seq
        if output.error is not None:
            event = token_event(seq, FinishReason.ERROR, error=output.error)
            return ProcessedOutput(seq, (), FinishReason.ERROR, event)
        if seq.output is None:
            seq.output = OutputText(seq.sampling.stop)
        kept: list[int] = []
        emitted: list[int] = []
        texts: list[str] = []
        logprobs: list[TokenLogprob] = []
        reason: FinishReason | None = None
        for token in output.sampled:
            kept.append(token.token_id)
            reason, text, is_emitted = self._judge(seq, token.token_id, len(kept), ends=token.ends)
            if is_emitted:
                emitted.append(token.token_id)
                if token.logprob is not None:
                    logprobs.append(token.logprob)
            texts.append(text)
            if reason is not None:
                break
        event = token_event(
            seq, reason, token_ids=tuple(emitted), text="".join(texts), logprobs=tuple(logprobs), num_new=len(kept)
        )
        return ProcessedOutput(seq, tuple(kept), reason, event)

    def _judge(
        self, seq: Sequence, token_id: int, num_new: int, *, ends: bool = False
    ) -> tuple[FinishReason | None, str, bool]:
        """The `num_new`-th token of this step for `seq`: whether it ends the
        sequence, the text it releases, and whether its id is emitted (an
        end-of-generation or stop token is not). `ends`: the grammar is
        complete, so the sequence ends here even under `ignore_eos` or
        before `min_tokens`."""
        assert seq.output is not None
        params = seq.sampling
        num_output = seq.num_output_tokens + num_new
        may_stop = num_output > params.min_tokens
        is_eog = not params.ignore_eos and token_id in self._eog
        if ends or (may_stop and (is_eog or token_id in params.stop_token_ids)):
            return FinishReason.STOP, seq.output.flush(), False
        text = seq.output.push(self._token_bytes(token_id))
        reason = FinishReason.STOP if seq.output.stopped_by is not None else None
        if reason is None and (num_output >= params.max_tokens or seq.num_tokens + num_new >= self._n_ctx):
            reason = FinishReason.LENGTH
        if reason is not None:
            text += seq.output.flush()
        return reason, text, True


def token_event(
    seq: Sequence,
    finish_reason: FinishReason | None,
    *,
    token_ids: tuple[int, ...] = (),
    text: str = "",
    logprobs: tuple[TokenLogprob, ...] = (),
    error: str | None = None,
    num_new: int = 0,
) -> TokenEvent:
    """The event of `seq` once `num_new` more tokens are appended to it."""
    return TokenEvent(
        request_id=seq.request_id,
        token_ids=token_ids,
        text=text,
        logprobs=logprobs,
        finish_reason=finish_reason,
        error=error,
        num_prompt_tokens=seq.num_prompt_tokens,
        num_output_tokens=seq.num_output_tokens + num_new,
        num_cached_tokens=seq.num_cached_tokens,
        num_draft_tokens=seq.spec.num_drafted if seq.spec is not None else 0,
        num_accepted_tokens=seq.spec.num_accepted if seq.spec is not None else 0,
    )
