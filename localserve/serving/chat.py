"""Chat: a conversation (with tools or a JSON format, or neither) through
the model's own template, into the engine as an `Answer`."""

from __future__ import annotations

import asyncio
import dataclasses

from localserve.errors import InvalidRequestError
from localserve.serving.answer import Answer, submit
from localserve.serving.grammar import grammar_for
from localserve.serving.models import ChatModel, ModelHost, held_chat_model
from localserve.serving.prompts import chat_prompt, chat_text
from localserve.serving.reasoning import ReasoningFormat, reasoning_grammar
from localserve.serving.tools import ToolPlan, plan_tools, prompt_messages
from localserve.serving.types import ChatRequest, Message


async def start_chat(host: ModelHost, request: ChatRequest, *, answer_id: str) -> Answer:
    """Validate, build the prompt and queue the choices of a chat request."""
    model = await held_chat_model(host, request.model)
    plan = plan_tools(request.tools, model.tokenizer)
    if plan is not None and request.output is not None:
        param = request.output.param
        raise InvalidRequestError(
            f"{param} cannot be combined with tools; leave {param} out or let no tool be called", param=param
        )
    reasoning = ReasoningFormat.of(model.template)
    budget = request.reasoning_budget
    if budget is None and host.registry.settings.reasoning_budget >= 0:
        budget = host.registry.settings.reasoning_budget
    closed = not thinks(host, request) or budget == 0
    prompt_ids = await chat_prompt_ids(model, request, plan, thinking=not closed, reasoning=reasoning)
    grammar = plan.grammar if plan is not None else grammar_for(request.output)
    options = request.options
    if reasoning is not None and not closed:
        if grammar is not None:  # the grammar constrains the answer after the think section
            grammar = reasoning_grammar(reasoning, grammar)
        sampling = dataclasses.replace(options.sampling, think_budget=budget, think_opened=reasoning.starts_open)
        options = dataclasses.replace(options, sampling=sampling)
    else:
        reasoning = None  # no section (or a closed one): all of the output is the answer
    return await submit(
        model,
        answer_id,
        [prompt_ids],
        options,
        grammar=grammar,
        grammar_param="tools" if plan is not None else (request.output.param if request.output else ""),
        plan=plan,
        prompt_param=request.prompt_param,
        reasoning=reasoning,
    )


def thinks(host: ModelHost, request: ChatRequest) -> bool:
    """Whether the prompt leaves a reasoning model's think section open: the
    request's `think`, else the server's `--reasoning` (llama-server's)."""
    return request.think if request.think is not None else host.registry.settings.reasoning != "off"


async def chat_prompt_ids(
    model: ChatModel,
    request: ChatRequest,
    plan: ToolPlan | None,
    *,
    thinking: bool = True,
    reasoning: ReasoningFormat | None = None,
) -> list[int]:
    """The prompt's token ids, rendered and tokenized off the event loop (a
    long conversation takes a while, and the loop must keep streaming)."""
    template = model.template
    history, continuation = split_continuation(request)
    messages, tools = prompt_messages([m.for_template() for m in history], plan, template)
    return await asyncio.to_thread(
        chat_prompt,
        template,
        model.tokenizer,
        messages,
        tools,
        param=request.prompt_param,
        thinking=thinking,
        reasoning=reasoning,
        add_generation_prompt=request.add_generation_prompt,
        continuation=continuation,
    )


def split_continuation(request: ChatRequest) -> tuple[tuple[Message, ...], str | None]:
    """The messages to render, and the text of the last one when the answer
    continues it: when asked (`continue_final`), or by default when the
    conversation ends with an assistant message without tool calls
    (llama-server's prefill, Anthropic's too)."""
    messages = request.messages
    last = messages[-1] if messages else None
    wanted = request.continue_final
    if wanted is False or last is None or (wanted is None and (last.role != "assistant" or last.tool_calls)):
        return messages, None
    if last.role != "assistant":
        raise InvalidRequestError(
            "continue_final_message needs the last message to be the assistant's", param=request.prompt_param
        )
    if last.tool_calls:
        raise InvalidRequestError(
            "Cannot continue an assistant message that contains tool calls.", param=request.prompt_param
        )
    if wanted is None and len(messages) >= 2 and messages[-2].role == "assistant":
        raise InvalidRequestError(
            "Cannot have 2 or more assistant messages at the end of the list.", param=request.prompt_param
        )
    return messages[:-1], last.content


async def count_chat_tokens(host: ModelHost, request: ChatRequest) -> int:
    """How many tokens the prompt of `request` takes (nothing is generated)."""
    model = await held_chat_model(host, request.model)
    return len(await chat_prompt_ids(model, request, plan_tools(request.tools)))


async def render_chat(host: ModelHost, request: ChatRequest) -> tuple[str, str]:
    """The model id and the prompt text `request` renders to through the
    model's template, with its tools as the chat path gives them (nothing
    is tokenized or generated: llama-server's `/apply-template`)."""
    model = await held_chat_model(host, request.model)
    template = model.template
    history, continuation = split_continuation(request)
    messages, tools = prompt_messages([m.for_template() for m in history], plan_tools(request.tools), template)
    text = await asyncio.to_thread(
        chat_text,
        template,
        messages,
        tools,
        add_generation_prompt=request.add_generation_prompt,
        continuation=continuation,
        thinking=thinks(host, request),
        reasoning=ReasoningFormat.of(template),
    )
    return model.model_id, text
