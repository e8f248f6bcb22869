"""Fill-in-the-middle prompts from a GGUF's FIM tokens, as llama.cpp's
server builds them (prefix-suffix-middle order, repo-level extra context)::

    [BOS] [FIM_REP]myproject\\n                       (if the model has FIM_REP)
          [FIM_SEP]{filename}\\n{text}  ...            (each input_extra chunk;
                                                      "--- snippet ---" without FIM_SEP)
          [FIM_SEP]filename\\n                          (if the model has FIM_SEP)
    [FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]

Prefix, suffix and extra text are tokenized without parsing special tokens
(code that contains `<|fim_prefix|>` stays text); `prompt` (the start of the
middle, e.g. the current line up to the cursor) is parsed like llama.cpp does.

When it does not fit the context less the room kept for the answer, the
prefix loses its beginning and the suffix its end, the prefix keeping about
three quarters (llama.cpp's ratio), and the extra context goes first, oldest
chunks first. llama.cpp puts BOS after the extra context; here it leads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localserve.engine.backend import Tokenizer
from localserve.errors import ContextLengthError, InvalidRequestError
from localserve.serving.types import ExtraChunk

#: Tokens kept free for the answer when the request sets no limit.
DEFAULT_ANSWER_ROOM = 256
REPO_NAME = "myproject\n"
CURRENT_FILE = "filename\n"
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True, slots=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None


@dataclass(frozen=True, slots=True)
class FimPrompt:
    token_ids: list[int]
    truncated: bool


def fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The model's FIM tokens, or None if it lacks prefix, suffix or middle."""
    declared = getattr(tokenizer, "fim_token_ids", None)
    ids = declared() if declared is not None else {}
    if not all(name in ids for name in ("pre", "suf", "mid")):
        return None
    return FimTokens(ids["pre"], ids["suf"], ids["mid"], ids.get("rep"), ids.get("sep"))


def require_fim(tokenizer: Tokenizer, model_id: str, *, param: str | None) -> FimTokens:
    """The model's FIM tokens; a 400 that says so when it has none."""
    fim = fim_tokens(tokenizer)
    if fim is None:
        raise InvalidRequestError(
            f"model {model_id!r} cannot fill in the middle: its GGUF declares no FIM prefix/suffix/middle tokens. "
            "Load a code model with FIM tokens (e.g. Qwen2.5-Coder, StarCoder2, CodeGemma, DeepSeek-Coder).",
            param=param,
        )
    return fim


def fim_prompt(
    tokenizer: Tokenizer,
    fim: FimTokens,
    *,
    prefix: str | Sequence[int],
    suffix: str,
    prompt: str = "",
    extra: Sequence[ExtraChunk] = (),
    n_ctx: int,
    max_tokens: int | None,
) -> FimPrompt:
    """The prompt's token ids, cut to leave `max_tokens` (or a default) free."""

    def text_ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=False) if text else []

    prefix_ids = text_ids(prefix) if isinstance(prefix, str) else list(prefix)
    suffix_ids = text_ids(suffix)
    prompt_ids = tokenizer.encode(prompt, add_special=False, parse_special=True) if prompt else []
    extra_ids = _extra_ids(fim, extra, text_ids)
    bos_id = getattr(tokenizer, "bos_token_id", -1)
    bos = [bos_id] if getattr(tokenizer, "add_bos", False) and bos_id >= 0 else []

    answer_room = min(max_tokens or DEFAULT_ANSWER_ROOM, n_ctx // 2)
    room = n_ctx - answer_room - len(bos) - 3 - len(prompt_ids)
    if room < 0:
        raise ContextLengthError(
            f"the prompt ({len(prompt_ids)} tokens) leaves no room in this model's context of {n_ctx} tokens",
            param="prompt",
            n_prompt_tokens=len(prompt_ids),
            n_ctx=n_ctx,
        )
    n_suffix = min(len(suffix_ids), max(room // 4, room - len(prefix_ids)))
    n_prefix = min(len(prefix_ids), room - n_suffix)
    n_extra = min(len(extra_ids), room - n_prefix - n_suffix)
    token_ids = [
        *bos,
        *extra_ids[len(extra_ids) - n_extra :],
        fim.pre,
        *prefix_ids[len(prefix_ids) - n_prefix :],
        *prompt_ids,
        fim.suf,
        *suffix_ids[:n_suffix],
        fim.mid,
    ]
    truncated = (n_prefix, n_suffix, n_extra) != (len(prefix_ids), len(suffix_ids), len(extra_ids))
    return FimPrompt(token_ids, truncated)


def _extra_ids(fim: FimTokens, extra: Sequence[ExtraChunk], text_ids: Callable[[str], list[int]]) -> list[int]:
    ids: list[int] = []
    if fim.rep is not None:
        ids += [fim.rep, *text_ids(REPO_NAME)]
    for chunk in extra:
        if fim.sep is not None:
            ids += [fim.sep, *text_ids(chunk.filename + "\n")]
        else:
            ids += text_ids(SNIPPET_SEPARATOR)
        ids += text_ids(chunk.text)
    if fim.sep is not None:
        ids += [fim.sep, *text_ids(CURRENT_FILE)]
    return ids
