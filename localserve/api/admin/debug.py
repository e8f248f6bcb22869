"""Fault injection for reliability tests; never on by default.

With the environment variable `LOCALSERVE_ENABLE_FAULTS=1` (and only then)
the server has one more route:

* `POST /api/v1/debug/fault` `{"model": ID, "steps": N}` - the next N engine
  steps of that model raise inside the step, as a failing backend would
  (`Engine.set_fault_hook`). The requests of those steps end with an error;
  the step loop goes on.

It sits behind the API key like every other route.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.state import engine_of
from localserve.engine.types import StepBatch
from localserve.serving.models import hold_chat_model

ENABLE_ENV = "LOCALSERVE_ENABLE_FAULTS"
FAULT_PATH = "/api/v1/debug/fault"
MAX_FAULT_STEPS = 1000


class FaultRequest(BaseModel):
    """Body of `POST /api/v1/debug/fault`."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    steps: int = Field(default=1, ge=1, le=MAX_FAULT_STEPS)


class InjectedFault(RuntimeError):
    """What a faulty step raises."""


class StepFault:
    """A fault hook: raises in the next `num_steps` steps, then does nothing.
    Called on the model's step thread only, so its counter needs no lock."""

    def __init__(self, num_steps: int) -> None:
        self.num_steps_left = num_steps

    def __call__(self, batch: StepBatch) -> None:
        if self.num_steps_left <= 0:
            return
        self.num_steps_left -= 1
        raise InjectedFault(f"injected fault in step {batch.step_id}")


def faults_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(ENABLE_ENV, "").strip() == "1"


def register(app: web.Application, environ: Mapping[str, str] = os.environ) -> None:
    """Add the fault route, only if `LOCALSERVE_ENABLE_FAULTS=1`."""
    if faults_enabled(environ):
        app.router.add_post(FAULT_PATH, inject_fault)


async def inject_fault(request: web.Request) -> web.Response:
    """Arm a fault for the next `steps` steps of `model`."""
    body = await parse_body(request, FaultRequest)
    model_id = await hold_chat_model(RequestModels(request), body.model)
    engine_of(request).set_fault_hook(model_id, StepFault(body.steps))
    return web.json_response({"object": "debug.fault", "model": model_id, "steps": body.steps})
