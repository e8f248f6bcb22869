"""`ChoiceStream`: one choice's engine events as the serving layer's typed
deltas (no engine, no model: the events are written by hand)."""

from __future__ import annotations

from collections.abc import Sequence

from localserve.engine.types import FinishReason, TokenEvent, TokenLogprob
from localserve.errors import BackendError
from localserve.serving.answer import ChoiceStream
from localserve.serving.types import ChoiceEnd, TextDelta, ToolCallArguments, ToolCallEnd, ToolCallStart, Usage


class CharTokenizer:
    """One character per token id (`ord`)."""

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(map(chr, token_ids))


def feed(stream: ChoiceStream, *events: TokenEvent) -> list[object]:
    out: list[object] = []
    for event in events:
        stream.note(event)
        out += stream.deltas(event)
    return out


def text(piece: str, **fields: object) -> TokenEvent:
    return TokenEvent("r", tuple(map(ord, piece)), piece, **fields)  # type: ignore[arg-type]


def test_text_then_the_end_with_usage() -> None:
    stream = ChoiceStream(2, tools=False)
    lp = (TokenLogprob(ord("a"), -0.5),)
    deltas = feed(
        stream,
        text("a", logprobs=lp),
        TokenEvent("r", (), "", finish_reason=FinishReason.STOP, num_prompt_tokens=7, num_output_tokens=2),
    )
    assert deltas == [TextDelta(2, "a", lp), ChoiceEnd(2, "stop", Usage(7, 2, 0))]
    assert stream.token_ids == [ord("a")] and stream.first_token_ns > 0


def test_tool_call_deltas_and_the_first_piece_keeps_the_logprobs() -> None:
    stream = ChoiceStream(0, tools=True)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    lp = (TokenLogprob(1, -0.1),)
    cut = call.index('{"a"') + 3  # the arguments come in two pieces
    deltas = feed(stream, text(call[:cut], logprobs=lp), text(call[cut:]), text("", finish_reason=FinishReason.STOP))
    assert [type(d) for d in deltas] == [ToolCallStart, ToolCallArguments, ToolCallArguments, ToolCallEnd, ChoiceEnd]
    start = deltas[0]
    assert isinstance(start, ToolCallStart) and start.name == "add" and start.logprobs == lp
    assert all(d.logprobs == () for d in deltas[1:3])  # type: ignore[attr-defined]
    end = deltas[3]
    assert isinstance(end, ToolCallEnd) and end.call.arguments == '{"a": 1}' and end.call.id == start.call_id
    assert isinstance(deltas[-1], ChoiceEnd) and deltas[-1].num_tool_calls == 1


def test_which_stop_string_ended_the_choice() -> None:
    # The engine ends a stop-string event with the token that completed it; an EOS event carries none.
    stops = ("END", "\n\n")
    stream = ChoiceStream(0, tools=False, stops=stops, tokenizer=CharTokenizer())  # type: ignore[arg-type]
    (_, end) = feed(stream, text("ok"), text("\n\n", finish_reason=FinishReason.STOP))[-2:]
    assert isinstance(end, ChoiceEnd) and end.stop_sequence == "\n\n"
    eos = ChoiceStream(0, tools=False, stops=stops, tokenizer=CharTokenizer())  # type: ignore[arg-type]
    (last,) = feed(eos, TokenEvent("r", (), "", finish_reason=FinishReason.STOP))
    assert isinstance(last, ChoiceEnd) and last.stop_sequence is None
    cut = ChoiceStream(0, tools=False, stops=stops, tokenizer=CharTokenizer())  # type: ignore[arg-type]
    (_, last) = feed(cut, text("x", finish_reason=FinishReason.LENGTH))
    assert isinstance(last, ChoiceEnd) and last.finish_reason == "length" and last.stop_sequence is None


def test_a_failed_step_ends_the_choice_with_its_error() -> None:
    stream = ChoiceStream(1, tools=False)
    (end,) = feed(stream, TokenEvent("r", (), "", finish_reason=FinishReason.ERROR, error="device lost"))
    assert isinstance(end, ChoiceEnd) and end.finish_reason == "error"
    assert isinstance(end.error, BackendError) and end.error.message == "device lost"
