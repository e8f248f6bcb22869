"""OutputText: UTF-8 split across tokens, stop strings across pieces, holdback."""

from __future__ import annotations

from localserve.engine.step.output import OutputText


def push_all(output: OutputText, pieces: list[bytes]) -> list[str]:
    return [output.push(piece) for piece in pieces]


def single_bytes(text: str) -> list[bytes]:
    return [bytes([b]) for b in text.encode("utf-8")]


def test_two_byte_character_split_across_tokens_is_emitted_whole():
    output = OutputText()
    assert push_all(output, single_bytes("é")) == ["", "é"]
    assert output.flush() == ""


def test_emoji_split_into_single_bytes_is_emitted_once_complete():
    output = OutputText()
    deltas = push_all(output, [b"a"] + single_bytes("😀") + [b"b"])
    assert deltas == ["a", "", "", "", "😀", "b"]
    assert "".join(deltas) + output.flush() == "a😀b"


def test_character_cut_off_at_the_end_becomes_replacement_character():
    output = OutputText()
    assert output.push("é".encode()[:1]) == ""
    assert output.flush() == "\ufffd"


def test_stop_string_spanning_pieces_ends_text_before_it():
    output = OutputText(stop=("END",))
    deltas = push_all(output, [b"abc E", b"N", b"D and more"])
    assert deltas == ["abc ", "", ""]
    assert output.stopped_by == "END"
    assert output.push(b"later") == "" and output.flush() == ""


def test_stop_string_made_of_split_utf8_bytes():
    output = OutputText(stop=("é!",))
    deltas = push_all(output, [b"caf"] + single_bytes("é") + [b"!", b"?"])
    assert deltas == ["caf", "", "", "", ""]
    assert output.stopped_by == "é!"
    assert output.flush() == ""


def test_partial_stop_is_held_back_then_released_at_flush():
    output = OutputText(stop=("STOP",))
    assert push_all(output, [b"hello S", b"TO"]) == ["hello ", ""]
    assert output.flush() == "STO"
    assert output.stopped_by is None


def test_held_text_is_released_once_it_cannot_begin_a_stop():
    output = OutputText(stop=("STOP",))
    assert push_all(output, [b"ST", b"AR"]) == ["", "STAR"]


def test_earliest_stop_string_wins_when_one_piece_holds_two():
    output = OutputText(stop=("cd", "b"))
    assert output.push(b"abcd") == "a"
    assert output.stopped_by == "b"
    assert output.flush() == ""


def test_without_stop_strings_everything_is_emitted_at_once():
    output = OutputText()
    assert push_all(output, [b"S", b"TOP"]) == ["S", "TOP"]
    assert output.flush() == ""
