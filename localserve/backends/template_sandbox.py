"""A jinja2 sandbox with budgets, for untrusted chat templates (a GGUF's
template is whatever its author wrote).

jinja2's `ImmutableSandboxedEnvironment` blocks internals (`__class__`,
`__globals__`, ...) and changes to the inputs, but bounds neither work nor
memory: two nested `range(100000)` loops run for hours, and `'x' * 10**10`,
a string doubled in a loop or a list nested in itself twenty times fill the
memory. Here:

* **steps**: every loop iteration and every call (function, method, macro,
  filter) is a step; a render may take `MAX_STEPS` steps and `MAX_SECONDS`;
* **size**: whatever turns values into bigger ones (`*`, `+`, `~`, `**`,
  `%`, filters, string methods, writing a value out) first measures what it
  would make, as the length of its text, and refuses more than
  `MAX_VALUE_CHARS` (measuring stops at the limit, so it is cheap);
* **output**: everything the template writes, captured blocks included,
  counts against `MAX_OUTPUT_CHARS`.

A template over a budget raises `TemplateLimitError`. Steps and output are
counted inside `limited_render()`; the size checks apply everywhere (also to
the constant folding jinja does while compiling).
"""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

MAX_STEPS = 1_000_000
MAX_SECONDS = 5.0
MAX_VALUE_CHARS = 4_000_000  # text length of one value made by one operation
MAX_OUTPUT_CHARS = 16_000_000  # all output of a render, captured blocks included
MAX_INT_BITS = 100_000
MAX_COUNT = 100_000  # a width, padding or count argument

_STEP, _OUT, _CONCAT = "__localserve_step__", "__localserve_out__", "__localserve_concat__"
_HUGE_WIDTH = re.compile(r"\d{6,}|%[-#0 +]*\*|\{[^{}]*\{")  # 6+ digit widths, `%*d`, nested `{:{w}}`
_SEQUENCES = (str, list, tuple)
_COUNT_ARGS = {"center": 0, "ljust": 0, "rjust": 0, "zfill": 0, "indent": 0, "expandtabs": 0, "batch": 0, "slice": 0}


class TemplateLimitError(Exception):
    """The template went over one of this module's budgets."""


@dataclass(slots=True)
class _Budget:
    deadline: float
    steps_left: int = MAX_STEPS
    output_left: int = MAX_OUTPUT_CHARS


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("template_budget", default=None)


def _step() -> None:
    budget = _BUDGET.get()
    if budget is None:
        return
    budget.steps_left -= 1
    if budget.steps_left < 0:
        raise TemplateLimitError(f"it took more than {MAX_STEPS} steps (loop iterations and calls)")
    if budget.steps_left % 1024 == 0 and time.monotonic() > budget.deadline:
        raise TemplateLimitError(f"it ran for more than {MAX_SECONDS:g} s")


def text_size(value: Any, limit: int = MAX_VALUE_CHARS) -> int:
    """About `len(str(value))`, counting shared parts each time they appear;
    stops counting past `limit`."""
    if isinstance(value, str):  # the common case, first
        return len(value)
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, Namespace):
            stack.append(object.__getattribute__(item, "_Namespace__attrs"))
        elif isinstance(item, int) and not isinstance(item, bool):
            total += item.bit_length() // 3 + 1
        else:
            total += 16  # numbers, None, undefined, functions: short
    return total


def _check(value: Any, what: str, limit: int = MAX_VALUE_CHARS) -> None:
    if text_size(value, limit) > limit:
        raise TemplateLimitError(f"{what} would make a value over {limit} characters")


def _count(args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> int:
    """A width or count argument (by position, else the largest keyword one)."""
    value = args[index] if len(args) > index else max((v for v in kwargs.values() if isinstance(v, int)), default=0)
    return len(value) if isinstance(value, str) else value if isinstance(value, int) else 0


def _check_operation(name: str, subject: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Before a filter or string method `name` runs on `subject` with `args`."""
    if name in _COUNT_ARGS and _count(args, kwargs, _COUNT_ARGS[name]) > MAX_COUNT:
        raise TemplateLimitError(f"{name} with a count or width over {MAX_COUNT}")
    if name in ("format", "format_map") and isinstance(subject, str) and _HUGE_WIDTH.search(subject):
        raise TemplateLimitError(f"{name} with a width that is too large or computed")
    if name == "replace" and isinstance(subject, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        num = subject.count(old) if old else len(subject) + 1
        if len(subject) + num * len(new) > MAX_VALUE_CHARS:
            raise TemplateLimitError("replace would make a value over the limit")
    if name == "indent" and isinstance(subject, str) and len(subject) * (1 + _count(args, kwargs, 0)) > MAX_VALUE_CHARS:
        raise TemplateLimitError("indent would make a value over the limit")
    _check((subject, args, kwargs), name)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "+" and isinstance(left, str) and isinstance(right, str):  # the common case, first
        if len(left) + len(right) > MAX_VALUE_CHARS:
            raise TemplateLimitError(f"'+' would make a value over {MAX_VALUE_CHARS} characters")
    elif isinstance(left, int) and isinstance(right, int):
        bits = (
            abs(left).bit_length() * max(0, right)
            if operator == "**"
            else abs(left).bit_length() + abs(right).bit_length()
        )
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(f"'{operator}' would make a number of about {bits} bits")
    elif operator == "*" and isinstance(left, _SEQUENCES) != isinstance(right, _SEQUENCES):
        count, seq = (left, right) if isinstance(right, _SEQUENCES) else (right, left)
        if (
            isinstance(count, int)
            and max(0, count) * text_size(seq, MAX_VALUE_CHARS // max(1, count)) > MAX_VALUE_CHARS
        ):
            raise TemplateLimitError("'*' would make a value over the limit")
    elif operator == "%" and isinstance(left, str):
        _check_operation("format", left, (right,), {})
    else:
        _check((left, right), f"'{operator}'")


class _Filters(dict[str, Callable[..., Any]]):
    """The environment's filters, each checked before it runs (also those
    added after the environment was made)."""

    def __setitem__(self, name: str, func: Callable[..., Any]) -> None:
        super().__setitem__(name, _limited_filter(name, func))


def _limited_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    pass_arg = getattr(func, "jinja_pass_arg", None)  # jinja passes a context/environment first

    def limited(*args: Any, **kwargs: Any) -> Any:
        values = args[1:] if pass_arg is not None else args
        _step()
        if values:
            _check_operation(name, values[0], tuple(values[1:]), kwargs)
        return func(*args, **kwargs)

    if pass_arg is not None:
        limited.jinja_pass_arg = pass_arg  # type: ignore[attr-defined]
    return limited


def _noop() -> str:
    return ""


def _write(value: Any) -> Any:
    """Every value a template writes out (captured blocks too) passes here."""
    budget = _BUDGET.get()
    size = text_size(value, min(MAX_OUTPUT_CHARS, budget.output_left if budget else MAX_OUTPUT_CHARS) + 1)
    if budget is not None:
        budget.output_left -= size
        if budget.output_left < 0:
            raise TemplateLimitError(f"it wrote more than {MAX_OUTPUT_CHARS} characters")
    elif size > MAX_OUTPUT_CHARS:
        raise TemplateLimitError(f"it wrote more than {MAX_OUTPUT_CHARS} characters")
    return value


def _concat(*parts: Any) -> str:
    _check(parts, "'~'")
    return "".join(str(p) for p in parts)


class _Guards(NodeTransformer):
    """A step in every loop iteration, every written value measured, `~`
    through a size check."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)  # in place
        node.body.insert(0, nodes.Output([nodes.Call(nodes.Name(_STEP, "load"), [], [], None, None)]))
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [nodes.Call(nodes.Name(_OUT, "load"), [child], [], None, None) for child in node.nodes]
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.Name(_CONCAT, "load"), list(node.nodes), [], None, None)


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """`ImmutableSandboxedEnvironment` with the budgets of this module."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.update({_STEP: _noop, _OUT: _write, _CONCAT: _concat})
        builtin = self.filters
        self.filters = _Filters()
        for name, func in builtin.items():
            self.filters[name] = func

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        if any(n.name in (_STEP, _OUT, _CONCAT) for n in tree.find_all(nodes.Name)):
            raise jinja2.TemplateSyntaxError("the template uses a name reserved by the sandbox", 1, name, filename)
        return _Guards().visit(tree)  # type: ignore[no-any-return]

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        _step()
        target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        if isinstance(owner, (str, list, tuple, dict)):
            _check_operation(getattr(target, "__name__", ""), owner, args, kwargs)
        return super().call(context, obj, *args, **kwargs)


def limited_render(template: jinja2.Template, **variables: Any) -> str:
    """Render `template` (compiled by a `LimitedSandbox`) within the budgets."""
    budget = _Budget(deadline=time.monotonic() + MAX_SECONDS, steps_left=MAX_STEPS, output_left=MAX_OUTPUT_CHARS)
    token = _BUDGET.set(budget)
    try:
        return "".join(template.generate(**variables))
    finally:
        _BUDGET.reset(token)
