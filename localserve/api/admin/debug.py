"""Fault injection for reliability tests; never on by default.

With the environment variable `LOCALSERVE_ENABLE_FAULTS=1` (and only then)
every generative model the server loads runs through an
`engine.step.faults.FaultInjectingBackend`, and the server has one more route:

* `POST /api/v1/debug/fault` `{"model": ID, "steps": N}` - the next N engine
  steps of that model raise inside the step, as a failing backend would.
  The requests of those steps end with an error; the step loop goes on.

It sits behind the API key like every other route.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.routes import Route, add_routes
from localserve.api.state import REGISTRY, engine_of
from localserve.engine.step.faults import FaultInjectingBackend
from localserve.errors import InvalidRequestError
from localserve.serving.models import hold_chat_model

ENABLE_ENV = "LOCALSERVE_ENABLE_FAULTS"
FAULT_PATH = "/api/v1/debug/fault"
MAX_FAULT_STEPS = 1000


class FaultRequest(BaseModel):
    """Body of `POST /api/v1/debug/fault`."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    steps: int = Field(default=1, ge=1, le=MAX_FAULT_STEPS)


def faults_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(ENABLE_ENV, "").strip() == "1"


def register(app: web.Application, environ: Mapping[str, str] = os.environ) -> None:
    """Only if `LOCALSERVE_ENABLE_FAULTS=1`: wrap the models and add the fault route."""
    if faults_enabled(environ):
        app[REGISTRY].engine.wrap_backends(FaultInjectingBackend)
        add_routes(app, Route("POST", FAULT_PATH, inject_fault, FaultRequest))


async def inject_fault(request: web.Request) -> web.Response:
    """Arm a fault for the next `steps` steps of `model`."""
    body = await parse_body(request, FaultRequest)
    model_id = await hold_chat_model(RequestModels(request, name_fallback=False), body.model)
    backend = engine_of(request).backend(model_id)
    if not isinstance(backend, FaultInjectingBackend):  # loaded before `register` wrapped the engine's models
        raise InvalidRequestError(f"model {model_id!r} was loaded without fault injection", param="model")
    backend.fail_steps(body.steps)
    return web.json_response({"object": "debug.fault", "model": model_id, "steps": body.steps})
