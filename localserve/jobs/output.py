"""The output and error files of a batch, in OpenAI's line format:

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code", "request_id", "body"}, "error": null}

Answers with status 200 go to the output file, every other answer to the
error file (with its response, as OpenAI does); requests that never ran
(cancelled, expired) go to the error file with `response: null` and an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

from localserve.jobs.types import BatchError, BatchRecord, BatchStatus, new_id

EXPIRED = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}
CANCELLED = {"code": "batch_cancelled", "message": "This request was not executed: the batch was cancelled."}
NOT_RUN = {"code": "internal_error", "message": "This request could not be executed; see the server's log."}

Outputs = dict[str, tuple[Path, str] | None]  # "output"/"error" -> (finished temporary file, filename)


def result_line(result_id: str, custom_id: str, status_code: int, request_id: str, body_json: str) -> str:
    """One output (or error) line; `body_json` is the answer, already JSON."""
    head = json.dumps({"id": result_id, "custom_id": custom_id}, ensure_ascii=False)[:-1]
    response = f'{{"status_code": {int(status_code)}, "request_id": {json.dumps(request_id)}, "body": {body_json}}}'
    return f'{head}, "response": {response}, "error": null}}\n'


def error_line(custom_id: str, error: dict[str, Any]) -> str:
    """The error-file line of a request that never ran."""
    line = {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None, "error": error}
    return json.dumps(line, ensure_ascii=False) + "\n"


def write_outputs(store: Any, batch: BatchRecord, unfinished: dict[str, Any]) -> Outputs:
    """Write `batch`'s output and error files from the store's per-line results
    (in input order) to temporary files; lines with no result get `unfinished`.
    A file with no line is not made."""
    paths = {"output": store.temp_path(), "error": store.temp_path()}
    counts = {"output": 0, "error": 0}
    try:
        with paths["output"].open("w", encoding="utf-8") as out, paths["error"].open("w", encoding="utf-8") as err:
            for _line_no, custom_id, result_id, status_code, request_id, response in store.iter_lines(batch.id):
                kind = "output" if status_code == 200 else "error"
                target = out if kind == "output" else err
                if result_id is None:
                    target.write(error_line(custom_id, unfinished))
                else:
                    target.write(result_line(result_id, custom_id, status_code, request_id or "", response))
                counts[kind] += 1
            _sync(out)
            _sync(err)
    except BaseException:
        for path in paths.values():
            path.unlink(missing_ok=True)
        raise
    outputs: Outputs = {}
    for kind, path in paths.items():
        if counts[kind]:
            outputs[kind] = (path, f"{batch.id}_{kind}.jsonl")
        else:
            path.unlink(missing_ok=True)
            outputs[kind] = None
    return outputs


def _sync(f: TextIO) -> None:
    """On disk before the rename that publishes it."""
    f.flush()
    os.fsync(f.fileno())


def publish_outputs(
    store: Any,
    batch: BatchRecord,
    status: BatchStatus,
    unfinished: dict[str, Any],
    errors: list[BatchError] | None = None,
) -> BatchRecord:
    """Write `batch`'s output and error files and enter the final `status` with
    them, in one commit (on the store's thread). If either fails (a full disk),
    nothing is published and no temporary file is left: call again later."""
    outputs = write_outputs(store, batch, unfinished)
    try:
        return store.finish_batch(batch.id, status, outputs, errors)
    finally:
        for output in outputs.values():  # moved into place when the commit succeeded
            if output is not None:
                output[0].unlink(missing_ok=True)
