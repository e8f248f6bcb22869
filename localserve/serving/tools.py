"""Tool calling: the tools in the prompt, a grammar that makes the model's
calls well-formed, and the calls read back out of its text.

**Format.** Every model calls tools the Hermes way, the format Qwen 2.5,
Hermes, SmolLM3 and most open models are trained on::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, nothing before the first and only a newline between
them. A template that renders `tools` itself and already uses `<tool_call>`
gets the tools and the history as OpenAI structures (`native`); any other
template (SmolLM2's, for one, does not mention tools) gets a system prompt
that lists the tools and describes this format, and a history whose tool
calls and results are written out as text (`<tool_call>` / `<tool_response>`
blocks, results in a user turn, as Qwen's template does).

**Grammar.** One GBNF grammar, compiled by llama.cpp like `response_format`'s:

* a named function (OpenAI's forced function, Anthropic's `tool`): `root ::=
  ls-call`, exactly one call of it, whatever `parallel_tool_calls` says;
* `required` (Anthropic's `any`): one call with `parallel_tool_calls: false`
  (`disable_parallel_tool_use`), else one or more, at most
  `MAX_PARALLEL_CALLS`: after each closed call the model either ends or
  writes a newline and the next call. This is OpenAI's contract ("one or
  more"), as vLLM serves it; llama.cpp's server instead defaults to one. A
  model that was not trained on tool calls (SmolLM2) tends to repeat its
  call: a call identical to an earlier one of the same answer (same name,
  same parsed arguments) is never returned, and the answer ends where it
  starts (`tools_parse.ToolCallParser` holds every later call back until it
  is complete; a later call cut off by `max_tokens` is dropped, and the
  finish reason is `tool_calls` when a complete call came first);
* `auto`: `root ::= calls | text`, where `text` is anything that does not
  start with `<` (after at most four spaces). The first character decides:
  `<` commits the model to a well-formed call, anything else to free text.
  So a reply either starts with calls or is plain text; a call written in
  the middle of text is not recognised (it is not constrained either).

Once the last call the grammar allows is closed, the grammar accepts only
an end-of-generation token, so the answer ends right there (finish reason
`tool_calls`, stop reason `tool_use`) instead of running on to `max_tokens`.

The text every call has around its arguments (`<tool_call>\n{"name":
"NAME", "arguments":` and `\n</tool_call>`) is spelled in the model's own
tokens when the plan knows the model's tokenizer: the canonical tokens, and
only those. Written as characters, the model could spell it many ways ("get"
or "g" + "et" for `get_weather`), and where a forced call takes the model
away from what it wanted to say all those spellings are improbable and
nearly tied: the few-ULP differences between a prompt computed whole,
from the prefix cache, or beside other sequences then flip which spelling
wins, and the rest of the reply with it. With one spelling there is nothing
to flip, and the arguments follow the text the model was trained on.

Each call's `arguments` follow the function's `parameters` schema through
llama-cpp-python's own JSON-schema converter, so they always parse and
match it (within what the converter supports: types, properties, required,
enums, const, items, string lengths, patterns, formats; not numeric ranges).
llama.cpp's lazy grammars (constrain only after a trigger word) would let a
model write text before a call, but need trigger support in the sampler; the
first-character alternation needs nothing beyond a plain grammar.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from localserve.backends.chat_template import ChatTemplate
from localserve.engine.backend import Tokenizer
from localserve.errors import InvalidRequestError
from localserve.serving.grammar import check_grammar, closed_objects, json_options
from localserve.serving.types import FunctionTool, Tools

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
MAX_PARALLEL_CALLS = 8

SYSTEM_PROMPT = """You can call functions ("tools") to help answer. These are the tools, as JSON:
{tools}

To call a tool, reply with only this, one block per call:
<tool_call>
{{"name": "<tool name>", "arguments": {{<the arguments, as JSON>}}}}
</tool_call>
{when}"""
WHEN_AUTO = "If no tool is needed, answer the user directly in plain text."
WHEN_REQUIRED = "You must call a tool now."


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The tools in play for one request and how they may be used."""

    tools: tuple[dict[str, Any], ...]  # OpenAI tool objects, for templates and the system prompt
    required: bool  # the reply must be tool calls (tool_choice required or named)
    parallel: bool
    grammar: str

    @property
    def names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]


def plan_tools(tools: Tools | None, tokenizer: Tokenizer | None = None) -> ToolPlan | None:
    """The plan for `tools` under their choice; None when no tool may be called.
    With the model's `tokenizer`, the grammar spells the calls' fixed text in
    its tokens (module docstring)."""
    if tools is None or not tools.functions or tools.choice == "none":
        return None
    selected = list(tools.functions)
    if tools.choice == "named":
        selected = [function for function in selected if function.name == tools.name]
    required = tools.choice in ("required", "named")
    parallel = tools.parallel and tools.choice != "named"  # a named function is called once
    objects = tuple(_tool_object(function) for function in selected)
    functions = json.dumps([tool["function"] for tool in objects], sort_keys=True)
    spellings = _spellings([tool["function"]["name"] for tool in objects], tokenizer) if tokenizer else ()
    try:
        grammar = _grammar(functions, required=required, parallel=parallel, spellings=spellings)
    except (InvalidRequestError, ValueError) as exc:
        message = exc.message if isinstance(exc, InvalidRequestError) else str(exc)
        raise InvalidRequestError(
            f"a tool's parameters cannot be turned into a grammar: {message}", param="tools"
        ) from None
    return ToolPlan(objects, required, parallel, grammar)


def _tool_object(tool: FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


# ---- the prompt ------------------------------------------------------------------------


def renders_tools(template: ChatTemplate) -> bool:
    """Does the model's own template write the tools, in this module's format?"""
    return not template.is_default and "tools" in template.source and TOOL_OPEN in template.source


def prompt_messages(
    messages: Sequence[dict[str, Any]], plan: ToolPlan | None, template: ChatTemplate
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages to render, and the `tools` to give the template (None
    when the template does not take them)."""
    if renders_tools(template):
        wants_objects = "arguments | tojson" in template.source or "arguments|tojson" in template.source
        return [_native_message(m, wants_objects) for m in messages], list(plan.tools) if plan else None
    out = _inline_history(messages)
    if plan is not None:
        out = _with_system_prompt(out, plan)
    return out, None


def _native_message(message: dict[str, Any], wants_objects: bool) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    converted = []
    for call in calls:
        function = dict(call["function"])
        function["arguments"] = (
            _arguments_object(function["arguments"]) if wants_objects else _arguments_text(function["arguments"])
        )
        converted.append({**call, "function": function})
    return {**message, "tool_calls": converted}


def _inline_history(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls and results written out as text, for templates that know
    nothing of them; consecutive results share one user turn."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "tool":
            block = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
            continue
        calls = message.get("tool_calls")
        if calls:
            blocks = [format_call(c["function"]["name"], _arguments_object(c["function"]["arguments"])) for c in calls]
            text = "\n".join(filter(None, [message.get("content") or "", *blocks]))
            message = {k: v for k, v in message.items() if k != "tool_calls"} | {"content": text}
        out.append(message)
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]


def _with_system_prompt(messages: list[dict[str, Any]], plan: ToolPlan) -> list[dict[str, Any]]:
    tools = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in plan.tools)
    text = SYSTEM_PROMPT.format(tools=tools, when=WHEN_REQUIRED if plan.required else WHEN_AUTO)
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def format_call(name: str, arguments: Any) -> str:
    """One call in the model's format (for history written as text)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_OPEN}\n{body}\n{TOOL_CLOSE}"


def _arguments_object(arguments: str | dict[str, Any]) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # a client's malformed history: keep it as it came
    return arguments


def _arguments_text(arguments: str | dict[str, Any]) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


# ---- the grammar -----------------------------------------------------------------------


def _head(name: str) -> str:
    """A call's text up to its arguments (the space before them is left to
    the model, which writes it together with the arguments' first characters)."""
    return f'{TOOL_OPEN}\n{{"name": {json.dumps(name)}, "arguments":'


_CLOSE = f"\n{TOOL_CLOSE}"

Spellings = tuple[tuple[str, tuple[int, ...]], ...]  # fixed text -> the token ids that spell it


def _spellings(names: Sequence[str], tokenizer: Tokenizer) -> Spellings:
    """The model's canonical tokens for each call's fixed text; text whose
    tokens do not give it back exactly (a tokenizer that adds a leading
    space, say) is left out and stays characters."""
    out = []
    for text in [*(_head(name) for name in names), _CLOSE]:
        ids = tuple(tokenizer.encode(text, add_special=False, parse_special=True))
        if ids and tokenizer.decode(ids) == text:
            out.append((text, ids))
    return tuple(out)


def _fixed(text: str, spellings: dict[str, tuple[int, ...]]) -> str:
    """Lark for fixed text: its tokens where known, else its characters."""
    ids = spellings.get(text)
    return " ".join(f"<[{token}]>" for token in ids) if ids else json.dumps(text)


@lru_cache(maxsize=64)
def _grammar(functions_json: str, *, required: bool, parallel: bool, spellings: Spellings = ()) -> str:
    import llguidance

    spelled = dict(spellings)
    alternatives = []
    for function in json.loads(functions_json):
        schema = closed_objects(function["parameters"])
        schema["x-guidance"] = json_options(strict=False)
        alternatives.append(f'{_fixed(_head(function["name"]), spelled)} " " %json {json.dumps(schema)}')
    rules = [
        f'ls_call: ( {" | ".join(alternatives)} ) "}}" {_fixed(_CLOSE, spelled)}',
        f'ls_calls: ls_call ( "\\n" ls_call ){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else "ls_calls: ls_call",
    ]
    if required:
        rules.insert(0, "start: ls_calls")
    else:
        # Free text may not start with "<" (or whitespace, but for a few spaces),
        # so the first character picks the branch and a call stays constrained.
        rules.insert(0, "start: ls_calls | LS_TEXT")
        rules.append("LS_TEXT: /[ ]{0,4}[^<\\x00-\\x20][^\\x00]*/")
    grammar = llguidance.LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
    check_grammar(grammar)
    return grammar
