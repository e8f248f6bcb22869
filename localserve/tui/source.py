"""Where the dashboard's snapshots come from, and where its actions go.

`HttpSource` talks to a running server over HTTP (the stats SSE stream,
the cancel and unload routes). Tests hand the app any other object with the
same shape (`SnapshotSource`), such as one that replays fixed snapshots.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from localserve.tui.snapshot import Snapshot

STREAM_PATH = "/api/v1/stats/stream"


class SourceError(Exception):
    """The server could not be reached, or refused; the message says why in one line."""


class SnapshotSource(Protocol):
    """What the dashboard needs from a server."""

    label: str  # shown in the header: the server's URL

    def snapshots(self) -> AsyncIterator[Snapshot]:
        """Snapshots as they come; raises `SourceError` when the connection fails or ends."""
        ...

    async def cancel(self, request_id: str) -> str:
        """Cancel a request; returns what to tell the user, raises `SourceError`."""
        ...

    async def unload(self, model_id: str) -> str:
        """Unload a model; returns what to tell the user, raises `SourceError`."""
        ...

    async def aclose(self) -> None: ...


class HttpSource:
    """A `localserve` server at `url`, with an optional API key."""

    def __init__(self, url: str, api_key: str | None = None, *, interval_ms: int = 500, timeout_s: float = 5.0) -> None:
        self.label = url.rstrip("/")
        self.interval_ms = interval_ms
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No proxies from the environment: the server is normally on this machine.
        self._client = httpx.AsyncClient(
            base_url=self.label,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(2.0, timeout_s)),
            trust_env=False,
        )

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        try:
            params = {"interval_ms": self.interval_ms}
            async with self._client.stream("GET", STREAM_PATH, params=params) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise SourceError(self._refusal(response))
                async for data in sse_data(response.aiter_lines()):
                    yield Snapshot.from_json(json.loads(data))
        except httpx.ConnectError:
            raise SourceError(f"cannot connect to {self.label}") from None
        except httpx.TimeoutException:
            raise SourceError(f"no answer from {self.label}") from None
        except (httpx.HTTPError, ValueError) as exc:
            raise SourceError(f"connection to {self.label} lost ({type(exc).__name__})") from None
        raise SourceError(f"{self.label} closed the stats stream")

    async def cancel(self, request_id: str) -> str:
        body = await self._post(f"/api/v1/requests/{quote(request_id, safe='')}/cancel", None)
        return f"cancelled {request_id} ({body.get('num_cancelled', 1)} sequence(s))"

    async def unload(self, model_id: str) -> str:
        await self._post("/api/v1/unload", {"model": model_id})
        return f"unloaded {model_id}"

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _post(self, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        try:
            response = await self._client.post(path, json=payload)
        except httpx.HTTPError as exc:
            raise SourceError(f"{self.label} did not answer ({type(exc).__name__})") from None
        if response.status_code != 200:
            raise SourceError(self._refusal(response))
        try:
            body = response.json()
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def _refusal(self, response: httpx.Response) -> str:
        """One line for an error answer, from the OpenAI envelope when there is one."""
        if response.status_code == 401:
            return f"{self.label} wants an API key: pass --api-key KEY or set LOCALSERVE_API_KEY"
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.reason_phrase
        if response.status_code == 404 and response.request.url.path == STREAM_PATH:
            return f"{self.label} has no stats stream (not a localserve server, or an old one)"
        return f"HTTP {response.status_code}: {message}"


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` of each server-sent event (multi-line data joined by newlines)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)
