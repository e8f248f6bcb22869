"""The Files API (OpenAI's), under `/v1` and `/api/v1`:

* `POST   files` - multipart upload: `file`, `purpose` (and optionally
  `expires_after[anchor]=created_at`, `expires_after[seconds]`)
* `GET    files` - `?purpose=&limit=&order=asc|desc&after=`
* `GET    files/{id}`, `GET files/{id}/content`, `DELETE files/{id}`

The bytes go to a temporary blob while they arrive (never all in memory) and
are renamed into place once the upload is complete and within the size limit.
A disk that fills (or is read-only) answers 507 and leaves no partial file or row.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable
from pathlib import Path
from typing import BinaryIO, TypeVar

from aiohttp import BodyPartReader, web

from localserve.api.doc_models import UPLOAD_FORM
from localserve.api.multipart import malformed_multipart_is_400
from localserve.api.openai.batch_service import jobs_of
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.api.state import SETTINGS
from localserve.disk import is_storage_error, storage_error
from localserve.errors import InvalidRequestError, PayloadTooLargeError
from localserve.jobs.types import UPLOAD_PURPOSES

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_FIELD_BYTES = 1024  # a form field other than the file
FORM_HELP = "Upload a file as multipart/form-data with the fields 'file' and 'purpose'."
WRITE_CHUNK = 1 << 20
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 24 * 3600


def register(app: web.Application) -> None:
    for prefix in API_PREFIXES:
        add_routes(
            app,
            Route("POST", f"{prefix}/files", upload_file, form=UPLOAD_FORM),
            Route("GET", f"{prefix}/files", list_files, query=("order", "limit", "purpose", "after")),
            Route("GET", f"{prefix}/files/{{file_id}}", get_file),
            Route("DELETE", f"{prefix}/files/{{file_id}}", delete_file),
            Route(
                "GET", f"{prefix}/files/{{file_id}}/content", file_content, media_types=("application/octet-stream",)
            ),
        )


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} must be a whole number; got {raw!r}", param=name) from None
    if not low <= value <= high:
        raise InvalidRequestError(f"{name} must be between {low} and {high}; got {value}", param=name)
    return value


async def upload_file(request: web.Request) -> web.Response:
    """`POST /v1/files`: store an uploaded file."""
    store, _ = await jobs_of(request)
    if not request.content_type.startswith("multipart/"):
        raise InvalidRequestError(FORM_HELP, param="file")
    limit = request.app[SETTINGS].batch_max_file_bytes
    tmp = store.temp_path()
    fields: dict[str, str] = {}
    filename: str | None = None
    try:
        with malformed_multipart_is_400(FORM_HELP):
            async for part in await request.multipart():
                if not isinstance(part, BodyPartReader):
                    continue  # a nested multipart: not part of this API
                if part.name == "file":
                    filename = Path(part.filename or "upload").name
                    await _stored(_save(part, tmp, limit), store.root, "storing the upload")
                elif part.name:
                    fields[part.name] = await _field_text(part)
        if filename is None:
            raise InvalidRequestError("Missing required parameter: 'file'.", param="file")
        purpose = _purpose(fields.get("purpose"))
        expires_at = _expires_at(fields, store.now())
        adding = store.call(store.add_file, tmp, filename, purpose, expires_at=expires_at)
        record = await _stored(adding, store.root, "recording the upload")
    finally:
        tmp.unlink(missing_ok=True)  # gone already unless something failed
    return web.json_response(record.to_openai())


async def _stored(write: Awaitable[T], root: Path, what: str) -> T:
    """`await write`; a full or read-only disk is a 507 that says so (the
    caller removes the temporary file: no partial file or row is left)."""
    try:
        return await write
    except (OSError, sqlite3.Error) as exc:
        if not is_storage_error(exc):
            raise
        log.warning("upload not stored: %s", exc)
        raise storage_error(exc, root, what) from None


async def _save(part: BodyPartReader, tmp: Path, limit: int) -> int:
    """Stream the part to `tmp` (writes off the event loop); 413 past `limit`."""
    num_bytes = 0
    f: BinaryIO = await asyncio.to_thread(tmp.open, "wb")
    try:
        buffer = bytearray()
        while chunk := await part.read_chunk(WRITE_CHUNK):
            num_bytes += len(chunk)
            if num_bytes > limit:
                raise PayloadTooLargeError(f"The file is larger than the limit of {limit} bytes.")
            buffer += chunk
            if len(buffer) >= WRITE_CHUNK:
                await asyncio.to_thread(f.write, bytes(buffer))
                buffer.clear()
        await asyncio.to_thread(f.write, bytes(buffer))
    finally:
        await asyncio.to_thread(f.close)
    return num_bytes


async def _field_text(part: BodyPartReader) -> str:
    raw = await part.read_chunk(MAX_FIELD_BYTES + 1)
    if len(raw) > MAX_FIELD_BYTES:
        raise InvalidRequestError(f"The form field {part.name!r} is too long.", param=part.name)
    return raw.decode("utf-8", errors="replace").strip()


def _purpose(value: str | None) -> str:
    if not value:
        raise InvalidRequestError("Missing required parameter: 'purpose'.", param="purpose")
    if value not in UPLOAD_PURPOSES:
        raise InvalidRequestError(
            f"Invalid value for 'purpose': {value!r}; use one of {', '.join(UPLOAD_PURPOSES)}.", param="purpose"
        )
    return value


def _expires_at(fields: dict[str, str], now: int) -> int | None:
    """`expires_after[anchor]=created_at` + `expires_after[seconds]`, as OpenAI's form fields."""
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequestError("expires_after[anchor] must be 'created_at'.", param="expires_after.anchor")
    try:
        value = int(seconds or "")
    except ValueError:
        value = -1
    if not MIN_EXPIRY_S <= value <= MAX_EXPIRY_S:
        raise InvalidRequestError(
            f"expires_after[seconds] must be between {MIN_EXPIRY_S} and {MAX_EXPIRY_S}.", param="expires_after.seconds"
        )
    return now + value


async def list_files(request: web.Request) -> web.Response:
    """`GET /v1/files`: newest first unless `order=asc`; cursor `after`."""
    store, _ = await jobs_of(request)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError(f"order must be 'asc' or 'desc'; got {order!r}", param="order")
    limit = query_int(request, "limit", 10_000, 1, 10_000)
    files, has_more = await store.call(
        store.list_files,
        purpose=request.query.get("purpose") or None,
        after=request.query.get("after") or None,
        limit=limit,
        order=order,
    )
    data = [f.to_openai() for f in files]
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


async def get_file(request: web.Request) -> web.Response:
    store, _ = await jobs_of(request)
    record = await store.call(store.get_file, request.match_info["file_id"])
    return web.json_response(record.to_openai())


async def file_content(request: web.Request) -> web.StreamResponse:
    """The file's bytes, as uploaded or written."""
    store, _ = await jobs_of(request)
    record = await store.call(store.get_file, request.match_info["file_id"])
    safe_name = "".join(c for c in record.filename if c.isascii() and c.isprintable() and c not in '"\\')
    headers = {
        "Content-Type": "application/octet-stream",
        "Content-Disposition": f'attachment; filename="{safe_name}"',
    }
    return web.FileResponse(store.blob_path(record.id), headers=headers)


async def delete_file(request: web.Request) -> web.Response:
    store, _ = await jobs_of(request)
    file_id = request.match_info["file_id"]
    await store.call(store.delete_file, file_id)
    return web.json_response({"id": file_id, "object": "file", "deleted": True})
