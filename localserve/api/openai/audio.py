"""`POST /v1/audio/transcriptions` and `POST /v1/audio/translations`
(multipart, as OpenAI's): read the form, call `serving.transcription`
(decode, cut at pauses, batch the windows of every request together), and
answer as json, text, srt, vtt or verbose_json."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from localserve.api.doc_models import SPEECH_FORM, SPEECH_TYPES
from localserve.api.hosting import RequestModels
from localserve.api.multipart import malformed_multipart_is_400
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.api.state import SETTINGS
from localserve.engine.types import parse_priority
from localserve.errors import InvalidRequestError, PayloadTooLargeError
from localserve.serving.transcription import Task, Transcript, TranscriptionRequest, transcribe

MAX_FIELD_BYTES = 64 * 1024  # any form field but the file
FORM_HELP = "Send the audio as multipart/form-data with a 'file' field and a 'model' field."
LANGUAGE_NAMES = {
    "en": "english", "de": "german", "es": "spanish", "fr": "french", "it": "italian", "ja": "japanese",
    "ko": "korean", "nl": "dutch", "pl": "polish", "pt": "portuguese", "ru": "russian", "sv": "swedish",
    "tr": "turkish", "uk": "ukrainian", "zh": "chinese", "ar": "arabic", "hi": "hindi",
}  # fmt: skip


@dataclass(slots=True)
class SpeechForm:
    """The multipart fields of a transcription or translation request."""

    file: bytes = b""
    filename: str = ""
    has_file: bool = False  # a 'file' part came, perhaps empty
    fields: dict[str, str] = field(default_factory=dict)
    granularities: list[str] = field(default_factory=list)

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.fields.get(name)
        return value if value not in (None, "") else default


def register(app: web.Application) -> None:
    """Add the audio routes to `app`."""
    for prefix in API_PREFIXES:
        add_routes(
            app,
            Route("POST", f"{prefix}/audio/transcriptions", transcriptions, form=SPEECH_FORM, media_types=SPEECH_TYPES),
            Route("POST", f"{prefix}/audio/translations", translations, form=SPEECH_FORM, media_types=SPEECH_TYPES),
        )


async def transcriptions(request: web.Request) -> web.StreamResponse:
    return await _speech(request, task="transcribe")


async def translations(request: web.Request) -> web.StreamResponse:
    """Speech in any language to English text (an English-only model hears English anyway)."""
    return await _speech(request, task="translate")


async def _speech(request: web.Request, *, task: Task) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    form = await read_form(request, max_file_bytes=settings.max_audio_bytes)
    speech = speech_request(form, task)
    transcript = await transcribe(RequestModels(request), speech, max_audio_seconds=settings.max_audio_seconds)
    return render(transcript, speech.response_format, speech.granularities)


def speech_request(form: SpeechForm, task: Task) -> TranscriptionRequest:
    """The form as the serving layer's request; 400 for a missing part or a
    field that is not of its type (the serving layer checks the values)."""
    model_id = form.text("model")
    if model_id is None:
        raise InvalidRequestError("Missing required parameter: 'model'.", param="model")
    if not form.has_file:
        raise InvalidRequestError("Missing required parameter: 'file' (the audio, as a multipart file).", param="file")
    try:
        priority = parse_priority(form.text("priority"))
    except ValueError as exc:
        raise InvalidRequestError(str(exc), param="priority") from None
    return TranscriptionRequest(
        model=model_id,
        audio=form.file,
        task=task,
        language=form.text("language"),
        prompt=form.text("prompt"),
        temperature=_number(form.text("temperature", "0"), "temperature"),
        timestamp_granularities=tuple(form.granularities),
        response_format=form.text("response_format", "json") or "json",
        priority=priority,
        filename=form.filename,
    )


async def read_form(request: web.Request, *, max_file_bytes: int) -> SpeechForm:
    """Stream the multipart body; stop reading the file past `max_file_bytes` (413)."""
    if not request.content_type.startswith("multipart/"):
        raise InvalidRequestError(FORM_HELP)
    form = SpeechForm()
    with malformed_multipart_is_400(FORM_HELP):
        async for part in await request.multipart():
            if isinstance(part, BodyPartReader):  # a nested multipart is not part of this API
                await _read_part(part, form, max_file_bytes)
    return form


async def _read_part(part: BodyPartReader, form: SpeechForm, max_file_bytes: int) -> None:
    name = part.name or ""
    limit = max_file_bytes if name == "file" else MAX_FIELD_BYTES
    data = bytearray()
    while chunk := await part.read_chunk(64 * 1024):
        data += chunk
        if len(data) > limit:
            if name == "file":
                raise PayloadTooLargeError(
                    f"The audio file is larger than the limit of {max_file_bytes} bytes "
                    f"({max_file_bytes / 1024 / 1024:g} MiB). Send a shorter or more compressed file."
                )
            raise InvalidRequestError(f"The form field {name!r} is longer than {MAX_FIELD_BYTES} bytes.", param=name)
    if name == "file":
        form.file, form.filename, form.has_file = bytes(data), part.filename or "", True
    elif name in ("timestamp_granularities[]", "timestamp_granularities"):
        form.granularities.append(data.decode("utf-8", errors="replace").strip())
    else:
        form.fields[name] = data.decode("utf-8", errors="replace").strip()


def _number(text: str | None, param: str) -> float:
    try:
        return float(text or 0)
    except ValueError:
        raise InvalidRequestError(f"'{param}' must be a number; got {text!r}", param=param) from None


# ---- response formats --------------------------------------------------------------------


def render(transcript: Transcript, fmt: str, granularities: tuple[str, ...] = ("segment",)) -> web.Response:
    """The answer in `fmt`: JSON for json/verbose_json, plain text otherwise."""
    if fmt == "json":
        return web.json_response({"text": transcript.text, "usage": _usage(transcript)})
    if fmt == "verbose_json":
        return web.json_response(verbose_json(transcript, granularities))
    if fmt == "srt":
        return web.Response(text=srt(transcript), content_type="application/x-subrip")
    if fmt == "vtt":
        return web.Response(text=vtt(transcript), content_type="text/vtt")
    return web.Response(text=transcript.text + "\n", content_type="text/plain")


def verbose_json(transcript: Transcript, granularities: tuple[str, ...]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": transcript.task,
        "language": LANGUAGE_NAMES.get(transcript.language, transcript.language),
        "duration": round(transcript.duration_s, 3),
        "text": transcript.text,
    }
    if "segment" in granularities:
        body["segments"] = [
            {
                "id": i,
                "seek": s.seek,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "tokens": list(s.tokens),
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
            }
            for i, s in enumerate(transcript.segments)
        ]
    if "word" in granularities:
        body["words"] = [
            {"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)} for w in transcript.words
        ]
    body["usage"] = _usage(transcript)
    return body


def srt(transcript: Transcript) -> str:
    blocks = [
        f"{i}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{s.text.strip()}\n"
        for i, s in enumerate(transcript.segments, 1)
    ]
    return "\n".join(blocks)


def vtt(transcript: Transcript) -> str:
    blocks = [
        f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n{s.text.strip()}\n" for s in transcript.segments
    ]
    return "WEBVTT\n\n" + "\n".join(blocks)


def _timestamp(seconds: float, decimal: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def _usage(transcript: Transcript) -> dict[str, Any]:
    return {"type": "duration", "seconds": math.ceil(transcript.duration_s)}
