"""Drive load against one server: closed-loop concurrency, open-loop Poisson
arrivals, and an optional probe stream beside either."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from localserve.bench.client import RequestResult, stream_request
from localserve.bench.workload import ClassPicker, RequestClass, Workload


@dataclass(frozen=True, slots=True)
class Probe:
    """Open-loop requests of one class sent beside the main load, e.g. a few
    interactive requests under a saturating batch load. A level with a probe
    ends when the probe's requests are done; the main load is then cut off."""

    request_class: RequestClass
    rate: float  # requests/s, Poisson arrivals
    num_requests: int
    output_tokens: int
    prompt_tokens: int
    delay_s: float = 2.0  # head start of the main load, so the probe meets it in full swing


@dataclass(frozen=True, slots=True)
class Level:
    """One measurement: `concurrency` workers in a closed loop, or Poisson
    arrivals at `rate` requests/s. It ends after `num_requests` (0: no limit)
    or `duration_s` (0: no limit; requests still running are cut off), or
    when its probe is done."""

    kind: str  # "concurrency" | "rate"
    value: float
    num_requests: int = 0
    duration_s: float = 0.0
    probe: Probe | None = None

    @property
    def label(self) -> str:
        text = f"c={self.value:g}" if self.kind == "concurrency" else f"rate={self.value:g}/s"
        return text + (f" + probe {self.probe.request_class.name}" if self.probe else "")


@dataclass(slots=True)
class LevelResult:
    level: Level
    started_at: float
    ended_at: float
    results: list[RequestResult] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.ended_at - self.started_at


class Budget:
    """How many more requests a loop may start, and until when."""

    def __init__(self, num_requests: int = 0, deadline: float = 0.0) -> None:
        self.left = num_requests or -1
        self.deadline = deadline
        self.stopped = False

    def take(self) -> bool:
        if self.stopped or self.left == 0 or (self.deadline and time.perf_counter() >= self.deadline):
            return False
        self.left -= 1
        return True


class LoadRunner:
    """Sends a workload to one OpenAI-compatible server (`async with` it)."""

    def __init__(
        self,
        base_url: str,
        workload: Workload,
        classes: Sequence[RequestClass],
        *,
        api_key: str | None = None,
        seed: int = 0,
        timeout_s: float = 600.0,
    ) -> None:
        self.url = base_url.rstrip("/") + workload.path
        self.workload = workload
        self.classes = tuple(classes)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.seed = seed
        self._num_sent = 0
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LoadRunner:
        # No client-side cap on concurrent streams, and one connection per request: some servers
        # (llama-server) close a connection after a stream, and reusing it would fail the next request.
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def warmup(self, num_requests: int, output_tokens: int = 16) -> list[RequestResult]:
        """A few short requests, one after another, not measured."""
        results = []
        for _ in range(num_requests):
            result = RequestResult("warmup")
            await self._send(result, self.classes[0], output_tokens=output_tokens)
            results.append(result)
        return results

    async def run(self, level: Level) -> LevelResult:
        """Run one level and return every request's timings."""
        outcome = LevelResult(level, started_at=time.perf_counter(), ended_at=0.0)
        tasks: set[asyncio.Task[None]] = set()
        picker = ClassPicker(self.classes)

        def launch(request_class: RequestClass, **sizes: int) -> asyncio.Task[None]:
            result = RequestResult(request_class.name)
            outcome.results.append(result)
            task = asyncio.create_task(self._send(result, request_class, **sizes))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            return task

        deadline = outcome.started_at + level.duration_s if level.duration_s else 0.0
        budget = Budget(level.num_requests, deadline)
        if level.kind == "concurrency":
            main = asyncio.create_task(_closed_loop(int(level.value), budget, lambda: launch(picker.next())))
        else:
            rng = random.Random(self.seed + 1)
            main = asyncio.create_task(_open_loop(level.value, budget, lambda: launch(picker.next()), rng))
        if level.probe is not None:
            await _run_probe(level.probe, launch, random.Random(self.seed + 2))
        elif level.duration_s:
            await asyncio.wait({main}, timeout=level.duration_s)
        else:
            await main
        outcome.ended_at = time.perf_counter()
        budget.stopped = True
        for task in [main, *tasks]:
            task.cancel()
        await asyncio.gather(main, *tasks, return_exceptions=True)
        return outcome

    async def _send(self, result: RequestResult, request_class: RequestClass, **sizes: int) -> None:
        assert self._session is not None, "use `async with LoadRunner(...)`"
        self._num_sent += 1
        body = self.workload.body(self.seed * 1_000_003 + self._num_sent, request_class, **sizes)
        await stream_request(self._session, self.url, body, result, self.headers)


async def _closed_loop(concurrency: int, budget: Budget, launch: Callable[[], asyncio.Task[None]]) -> None:
    async def worker() -> None:
        while budget.take():
            await launch()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _open_loop(rate: float, budget: Budget, launch: Callable[[], asyncio.Task[None]], rng: random.Random) -> None:
    pending: list[asyncio.Task[None]] = []
    next_at = time.perf_counter()
    while budget.take():
        pending.append(launch())
        next_at += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    await asyncio.gather(*pending)


async def _run_probe(probe: Probe, launch: Callable[..., asyncio.Task[None]], rng: random.Random) -> None:
    await asyncio.sleep(probe.delay_s)
    sizes: dict[str, Any] = {"output_tokens": probe.output_tokens, "prompt_tokens": probe.prompt_tokens}
    budget = Budget(probe.num_requests)
    await _open_loop(probe.rate, budget, lambda: launch(probe.request_class, **sizes), rng)
