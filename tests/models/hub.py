"""A stand-in for the Hugging Face Hub, on a loopback port in its own thread
(the pull code is blocking; the server under test has its own loop), answering
what huggingface_hub asks.

`GET /api/models/{owner}/{repo}/revision/{revision}` answers the repository's
commit and files (`siblings`: name, size, git blob id, LFS sha256), as
`HfApi.model_info(files_metadata=True)` reads them.

`HEAD|GET /{owner}/{repo}/resolve/{revision}/{file}` answers as the hub does:
an LFS file redirects (302) to `/cdn/...` on another host (127.0.0.2) with `X-Linked-Etag` (its sha256),
`X-Linked-Size` and `X-Repo-Commit`; a small file answers 200 with `ETag`
(its git blob sha1). The CDN honours `Range`. `drop_after[file] = n` cuts
the first GET of that file after n bytes (headers promised the whole file).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    data: bytes
    lfs: bool = True
    served_sha256: str | None = None  # lie about the digest (checksum tests)
    served_git_sha1: str | None = None


@dataclass
class FakeHub:
    files: dict[str, HubFile] = field(default_factory=dict)  # "owner/repo/file" -> content
    drop_after: dict[str, int] = field(default_factory=dict)
    bytes_sent: Counter[str] = field(default_factory=Counter)
    gets: list[tuple[str, str | None]] = field(default_factory=list)  # (file key, Range header)
    auth: list[str | None] = field(default_factory=list)
    port: int = 0

    def add(self, repo: str, name: str, data: bytes, *, lfs: bool = True, **lies: str) -> str:
        self.files[f"{repo}/{name}"] = HubFile(data, lfs, **lies)
        return f"{repo}/{name}"

    cdn_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn_url(self) -> str:
        """The CDN LFS files redirect to: another host, as on the real hub (huggingface_hub
        follows redirects that stay on the hub's host, and reads an LFS file's metadata
        from the redirect itself)."""
        return f"http://127.0.0.2:{self.cdn_port}"

    # ---- handlers ----------------------------------------------------------------------

    async def model_info(self, request: web.Request) -> web.Response:
        repo = f"{request.match_info['owner']}/{request.match_info['repo']}"
        self.auth.append(request.headers.get("Authorization"))
        siblings = []
        for key, hub_file in self.files.items():
            if not key.startswith(repo + "/"):
                continue
            sibling: dict[str, object] = {
                "rfilename": key.removeprefix(repo + "/"),
                "size": len(hub_file.data),
                "blobId": hub_file.served_git_sha1 or git_sha1(hub_file.data),
            }
            if hub_file.lfs:
                sha = hub_file.served_sha256 or hashlib.sha256(hub_file.data).hexdigest()
                sibling["lfs"] = {"sha256": sha, "size": len(hub_file.data), "pointerSize": 134}
            siblings.append(sibling)
        if not siblings:
            return web.json_response(
                {"error": "Repository not found"}, status=404, headers={"X-Error-Code": "RepoNotFound"}
            )
        return web.json_response({"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "siblings": siblings})

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        key = f"{info['owner']}/{info['repo']}/{info['file']}"
        self.auth.append(request.headers.get("Authorization"))
        hub_file = self.files.get(key)
        if hub_file is None:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        headers = {"X-Repo-Commit": COMMIT}
        if hub_file.lfs:
            sha = hub_file.served_sha256 or hashlib.sha256(hub_file.data).hexdigest()
            headers |= {"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(hub_file.data)), "ETag": '"abc"'}
            headers["Location"] = f"{self.cdn_url}/cdn/{key}"
            return web.Response(status=302, headers=headers)
        headers |= {"ETag": f'"{hub_file.served_git_sha1 or git_sha1(hub_file.data)}"'}
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(hub_file.data))
            return web.Response(status=200, headers=headers)
        return await self._send(request, key, hub_file.data, headers)

    async def cdn(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        return await self._send(request, key, self.files[key].data, {})

    async def _send(self, request: web.Request, key: str, data: bytes, headers: dict[str, str]) -> web.StreamResponse:
        range_header = request.headers.get("Range")
        self.gets.append((key, range_header))
        start = int(range_header.removeprefix("bytes=").split("-")[0]) if range_header else 0
        status = 206 if range_header else 200
        if range_header:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        response = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(len(body))})
        await response.prepare(request)
        cut = self.drop_after.pop(key, None)
        if cut is not None:  # promise the whole body, send part of it, hang up
            await response.write(body[:cut])
            self.bytes_sent[key] += cut
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()
            return response
        for offset in range(0, len(body), 64 * 1024):
            await response.write(body[offset : offset + 64 * 1024])
        self.bytes_sent[key] += len(body)
        await response.write_eof()
        return response

    # ---- life --------------------------------------------------------------------------

    def start(self) -> FakeHub:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            app = web.Application()
            route = "/{owner}/{repo}/resolve/{revision}/{file:.+}"
            app.router.add_route("HEAD", route, self.resolve)
            app.router.add_get(route, self.resolve, allow_head=False)
            app.router.add_get("/cdn/{key:.+}", self.cdn)
            app.router.add_get("/api/models/{owner}/{repo}/revision/{revision:.+}", self.model_info)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
            self.port = self._runner.addresses[0][1]
            await web.TCPSite(self._runner, "127.0.0.2", 0).start()
            self.cdn_port = self._runner.addresses[1][1]

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-hub", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
