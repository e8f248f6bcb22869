"""llama.cpp's request bodies, without HTTP: `/completion` (and
`/completions`) and `/infill` with the generation fields they share
(`LlamaParams`, with llama-server's defaults), `/tokenize`, `/detokenize`,
`/apply-template` and `/embedding(s)`; and the generation bodies as the
serving layer's sampling parameters, prompts and requests."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from localserve.engine.types import SamplingParams, parse_priority
from localserve.errors import InvalidRequestError
from localserve.serving import types as serving
from localserve.serving.llamacpp.bias import LogitBias
from localserve.serving.openai.schemas import ChatCompletionRequest, Priority
from localserve.serving.types import ExtraChunk, Options

INT32_MAX = 2**31 - 1  # llama.cpp takes these as int32


class InfillExtra(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str
    filename: str = "tmp"


class LlamaParams(BaseModel):
    """The generation fields llama.cpp's `/completion` and `/infill` share,
    with llama-server's defaults. `cache_prompt: false` computes the whole
    prompt (no cached prefix reused); `samplers` (the engine's chain is
    fixed), `id_slot` and `t_max_prompt_ms` are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n_predict: int = Field(default=-1, le=INT32_MAX)  # < 1: until the context is full
    t_max_predict_ms: int = 0  # <= 0: no limit
    n_indent: int = Field(default=0, ge=0)
    # llama.cpp server's defaults
    temperature: float = Field(default=0.8, ge=0.0, le=2.0)
    top_k: int = Field(default=40, ge=0, le=INT32_MAX)
    top_p: float = Field(default=0.95, ge=0.0, le=1.0)
    min_p: float = Field(default=0.05, ge=0.0, le=1.0)
    seed: int | None = None  # -1 or none: random
    stop: list[str] = Field(default_factory=list, max_length=16)
    repeat_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    repeat_last_n: int = Field(default=64, ge=0, le=INT32_MAX)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    ignore_eos: bool = False
    stream: bool = False
    return_tokens: bool = False
    response_fields: list[str] | None = None
    priority: Priority = None  # this server's extension

    n_probs: int = Field(default=0, ge=0, le=20)
    cache_prompt: bool = True
    samplers: list[str] | str | None = None
    id_slot: int = -1
    logit_bias: LogitBias | None = None
    post_sampling_probs: bool = False  # n_probs as probabilities (`prob`, `top_probs`)
    timings_per_token: bool = False  # `timings` on every streamed event
    return_progress: bool = False  # streamed: `prompt_progress` events before the first token


LlamaParamsT = TypeVar("LlamaParamsT", bound=LlamaParams)


class NativeInfillRequest(LlamaParams):
    input_prefix: str
    input_suffix: str
    input_extra: list[InfillExtra] = Field(default_factory=list)
    prompt: str = ""


PromptPart = int | str
Prompt = str | list[PromptPart]


class NativeCompletionRequest(LlamaParams):
    prompt: Prompt | list[Prompt | dict[str, Any]] | dict[str, Any] = ""
    n_cmpl: int = Field(default=1, ge=1, le=1)  # several completions of one prompt: not here


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    tokens: list[int] = Field(default_factory=list)


class ApplyTemplateRequest(ChatCompletionRequest):
    """A chat completion body (`add_generation_prompt`, `continue_final_message` included)."""


class NativeEmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    content: str | list[int | str] | list[str | list[int | str]] | None = None
    input: str | list[int | str] | list[str | list[int | str]] | None = None


def with_server_defaults(body: LlamaParamsT, temp: float, seed: int) -> LlamaParamsT:
    """`body` with the server's `--temp` and `--seed` where it sets none, as llama-server fills them."""
    update: dict[str, Any] = {}
    if "temperature" not in body.model_fields_set:
        update["temperature"] = temp
    if "seed" not in body.model_fields_set and seed >= 0:
        update["seed"] = seed
    return body.model_copy(update=update) if update else body


def sampling_of(body: LlamaParams, logit_bias: tuple[tuple[int, float], ...] = ()) -> SamplingParams:
    """The engine's parameters for a `/completion` or `/infill` body
    (`logit_bias`: the body's, as token ids: `bias.logit_bias_pairs`)."""
    return SamplingParams(
        temperature=body.temperature,
        top_k=body.top_k,
        top_p=body.top_p,
        min_p=body.min_p,
        repeat_penalty=body.repeat_penalty,
        penalty_last_n=body.repeat_last_n,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        seed=body.seed if body.seed is not None and body.seed >= 0 else None,
        stop=tuple(s for s in body.stop if s),
        ignore_eos=body.ignore_eos,
        logit_bias=logit_bias,
        cache_prompt=body.cache_prompt,
    )


def n_predict_of(asked: int, server_default: int) -> int:
    """llama-server's rule: the request's n_predict, else (-1) the server's --n-predict."""
    return server_default if asked < 0 else asked


def prompts_of(
    prompt: Prompt | list[Prompt | dict[str, Any]] | dict[str, Any], tokenizer: Any
) -> tuple[str | tuple[int, ...], ...]:
    """One entry per prompt: text, or token ids (a mix becomes ids)."""
    if isinstance(prompt, dict):
        return (_json_prompt(prompt),)
    if isinstance(prompt, str):
        return (prompt,)
    if not prompt:
        raise InvalidRequestError("'prompt' is empty", param="prompt")
    if all(isinstance(part, int | str) for part in prompt) and any(isinstance(part, int) for part in prompt):
        return (_token_ids(prompt, tokenizer),)  # type: ignore[arg-type]
    out: list[str | tuple[int, ...]] = []
    for entry in prompt:
        if isinstance(entry, dict):
            out.append(_json_prompt(entry))
        else:
            out.append(entry if isinstance(entry, str) else _token_ids(entry, tokenizer))  # type: ignore[arg-type]
    return tuple(out)


def _json_prompt(prompt: dict[str, Any]) -> str:
    """llama-server's JSON prompt: `{"prompt_string": text}` (text only here)."""
    text = prompt.get("prompt_string")
    if not isinstance(text, str) or prompt.get("multimodal_data"):
        raise InvalidRequestError(
            "a JSON prompt needs 'prompt_string'; multimodal data is not supported here", param="prompt"
        )
    return text


def _token_ids(parts: list[PromptPart], tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = []
    vocab_size = tokenizer.vocab_size
    for part in parts:
        if isinstance(part, int):
            if not 0 <= part < vocab_size:  # llama.cpp would refuse the whole step
                raise InvalidRequestError(
                    f"token id {part} in 'prompt' is outside the vocabulary (size {vocab_size})", param="prompt"
                )
            ids.append(part)
        else:
            ids.extend(tokenizer.encode(part, add_special=False, parse_special=True))
    return tuple(ids)


def completion_request(
    body: LlamaParams,
    model_id: str,
    prompts: tuple[str | tuple[int, ...], ...],
    logit_bias: tuple[tuple[int, float], ...],
    n_predict: int,
) -> serving.CompletionRequest:
    """A `/completion` body as a serving completion request (`prompts_of` its
    prompts, `n_predict_of` its length, `bias.logit_bias_pairs` its bias)."""
    options = Options(
        sampling=sampling_of(body, logit_bias),
        max_tokens=n_predict if n_predict > 0 else None,
        num_logprobs=body.n_probs or None,
        priority=parse_priority(body.priority),
    )
    return serving.CompletionRequest(model_id, prompts, options)


def infill_request(body: NativeInfillRequest, model_id: str) -> serving.InfillRequest:
    """An `/infill` body as a serving infill request for `model_id` (the
    body's `model`, else the server's choice)."""
    options = Options(
        sampling=sampling_of(body),
        max_tokens=body.n_predict if body.n_predict > 0 else None,
        priority=parse_priority(body.priority),
    )
    return serving.InfillRequest(
        model_id,
        body.input_prefix,
        body.input_suffix,
        body.prompt,
        tuple(ExtraChunk(chunk.filename, chunk.text) for chunk in body.input_extra),
        options,
        model_param="model" if body.model else None,
    )
