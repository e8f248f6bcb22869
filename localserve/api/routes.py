"""Each route of the server, described once.

A module that handles routes declares them as `Route`s (path, method,
handler, the pydantic model of its JSON body and of its answer where there
is one, query parameters, media types) and passes them to `add_routes`,
which registers them with aiohttp's router and records them on the app.
`admin/openapi.py` builds the OpenAPI document from that record, so the
router and the document come from the same declarations.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


#: Where the OpenAI-shaped routes answer: OpenAI's `/v1` and Lemonade's `/api/v1`.
API_PREFIXES = ("/v1", "/api/v1")

#: The 200 of llama-server's native routes that answer a list for a list of prompts or inputs
OBJECT_OR_LIST: Mapping[str, Any] = {"type": ["object", "array"]}


@dataclass(frozen=True, slots=True)
class Route:
    """One route: what aiohttp needs (`method`, `path`, `handler`) and what
    the OpenAPI document says of it."""

    method: str  # "GET" (aiohttp adds its HEAD twin), "POST", "DELETE"
    path: str  # aiohttp's pattern, e.g. "/v1/files/{file_id}"
    handler: Handler
    body: type[BaseModel] | None = None  # the model the handler validates its JSON body with (`parse_body`)
    response: type[BaseModel] | None = None  # a typed 200 JSON answer (else: `answer_schema`)
    answer_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})  # an untyped 200's
    query: tuple[str, ...] = ()  # query parameters the handler reads
    #: What a 200 may be; None: JSON, and a stream too when the body has a `stream` field.
    media_types: tuple[str, ...] | None = None
    form: Mapping[str, Any] | None = None  # the schema of a multipart/form-data body
    summary: str = ""  # "": the first line of the handler's docstring

    @property
    def canonical(self) -> str:
        """The path as the router names it: `{name}` without its pattern."""
        return re.sub(r"\{(\w+):[^{}]*\}", r"{\1}", self.path)

    @property
    def title(self) -> str:
        """The summary the document shows."""
        if self.summary:
            return self.summary
        name = f"{getattr(self.handler, '__module__', '')}.{getattr(self.handler, '__qualname__', '')}"
        return (inspect.getdoc(self.handler) or name).splitlines()[0]


ROUTE_TABLE = web.AppKey("route_table", list[Route])


def add_routes(app: web.Application, *routes: Route) -> None:
    """Register `routes` with the app's router and record them for the document."""
    table = app.get(ROUTE_TABLE)
    if table is None:
        table = app[ROUTE_TABLE] = []
    for route in routes:
        if route.method == "GET":
            app.router.add_get(route.path, route.handler)
        else:
            app.router.add_route(route.method, route.path, route.handler)
        table.append(route)


def declared_routes(app: web.Application) -> list[Route]:
    """Every route `add_routes` registered on `app`, in order."""
    table: list[Route] | None = app.get(ROUTE_TABLE)
    return list(table or ())
