"""`GET /openapi.json` documents every route from the code itself, and a
schemathesis run against a live server finds no 5xx, no answer outside the
document and no hang."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from localserve.api.admin.openapi import REF_TEMPLATE, app_routes, build_document
from localserve.serving.openai.embeddings import EmbeddingRequest
from localserve.serving.openai.request import ChatCompletionRequest, TextCompletionRequest
from tests.api.harness import API_KEY, MODEL_ID, ServerThread
from tests.reliability.conftest import EMBEDDING_MODEL, SPEECH_MODEL

#: Generation in the schemathesis run: this many new tokens at most.
MAX_NEW_TOKENS = 12
#: Left out of the schemathesis run: what changes the server's models (unload,
#: load, pull from the network, delete, and Ollama's pull, delete, copy), the
#: endless stats stream, and the `/api/v1/...` twins of OpenAI routes (the same
#: handlers as `/v1/...`).
EXCLUDED_PATHS = (
    r"^(/api/v1/(unload|load|pull|stats/stream|chat|completions|embeddings|audio|files|batches|models)"
    r"|/api/(pull|delete|copy)$)"
)
EXCLUDED_OPERATIONS = ("delete_v1_models_model_id",)


def _schema_of(doc: dict[str, Any], path: str, method: str = "post") -> dict[str, Any]:
    ref = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return doc["components"]["schemas"][ref.rsplit("/", 1)[1]]


# ---- the document ---------------------------------------------------------------------


def test_openapi_needs_the_key_and_lists_every_route(server: ServerThread) -> None:
    assert httpx.get(f"{server.base_url}/openapi.json", timeout=30).status_code == 401  # like every route but /health
    response = httpx.get(f"{server.base_url}/openapi.json", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["openapi"].startswith("3.1")
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    registered = {(m, p) for m, p, _ in app_routes(server.app)}
    assert registered == documented
    # The router's own table, HEAD twins of GETs aside: nothing is missing.
    for route in server.app.router.routes():
        if route.method not in ("HEAD", "OPTIONS", "*"):
            assert (route.method, route.resource.canonical) in documented
    for must in [("POST", "/v1/chat/completions"), ("GET", "/health"), ("POST", "/v1/audio/transcriptions")]:
        assert must in documented
    # The API key is documented and required everywhere but /health.
    assert doc["security"] == [{"bearer": []}, {"x-api-key": []}]  # either header carries the key
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert "security" not in doc["paths"]["/openapi.json"]["get"]
    assert httpx.get(f"{server.base_url}/v1/models", timeout=30).status_code == 401


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v1/chat/completions", ChatCompletionRequest),
        ("/v1/completions", TextCompletionRequest),
        ("/v1/embeddings", EmbeddingRequest),
    ],
)
def test_request_schemas_are_the_validating_models(server: ServerThread, path: str, model: type) -> None:
    doc = build_document(server.app)
    generated = model.model_json_schema(ref_template=REF_TEMPLATE)
    generated.pop("$defs", None)
    assert _schema_of(doc, path) == generated
    # Every $ref resolves inside the document.
    text = json.dumps(doc)
    for name in set(re.findall(r'"#/components/schemas/([^"]+)"', text)):
        assert name in doc["components"]["schemas"], name


def test_errors_are_documented_with_the_envelope(server: ServerThread) -> None:
    doc = build_document(server.app)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status in ("400", "401", "404", "408", "500", "503"):
                assert status in op["responses"], (method, path, status)
            schema = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
            expected = (
                "OllamaError"
                if path == "/" or (path.startswith("/api/") and not path.startswith("/api/v1/"))
                else "AnthropicError"
                if path.removeprefix("/api").startswith("/v1/messages")
                else "ErrorEnvelope"
            )
            assert schema.endswith(expected), (path, schema)
    envelope = doc["components"]["schemas"]["ErrorEnvelope"]
    assert envelope["required"] == ["error"]
    detail = doc["components"]["schemas"]["ErrorDetail"]
    assert set(detail["required"]) == {"message", "type", "param", "code"}
    # A real error conforms to it (checked fully by schemathesis below).
    bad = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": MODEL_ID, "messages": []},
        timeout=30,
    )
    assert bad.status_code == 400
    assert set(bad.json()["error"]) == {"message", "type", "param", "code"}


def test_the_fault_route_is_off_by_default(server: ServerThread) -> None:
    response = httpx.post(
        f"{server.base_url}/api/v1/debug/fault",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": MODEL_ID, "steps": 1},
        timeout=30,
    )
    assert response.status_code == 404
    assert "/api/v1/debug/fault" not in build_document(server.app)["paths"]


# ---- schemathesis -----------------------------------------------------------------------


def bounded_document(doc: dict[str, Any], *, chat: str, embeddings: str | None, speech: str | None) -> dict[str, Any]:
    """The document with generation bounded for a CI run: every request
    names a loaded model of its kind and asks for at most MAX_NEW_TOKENS
    tokens (schemathesis would otherwise often ask for a whole context)."""
    doc = copy.deepcopy(doc)
    schemas = doc["components"]["schemas"]
    for name, schema in schemas.items():
        props = schema.get("properties", {})
        required = schema.setdefault("required", [])
        if "model" in props and name != "UnloadRequest":
            # rerank, score and classify run on the embeddings model (a bi-encoder) here
            model = embeddings if any(k in name for k in ("Embed", "Rerank", "Score", "Classif")) else chat
            props["model"] = {"type": "string", "enum": [model or chat]}
        for field in ("max_tokens", "n_predict", "num_predict", "max_output_tokens"):
            if field in props:
                props[field] = {"type": "integer", "minimum": 1, "maximum": MAX_NEW_TOKENS}
                if field not in required:
                    required.append(field)
        for field, top in (
            ("max_completion_tokens", MAX_NEW_TOKENS),
            ("min_tokens", MAX_NEW_TOKENS),
            ("n", 2),
            ("best_of", 2),
        ):
            if field in props:
                props[field] = {"type": "integer", "minimum": 1 if field != "min_tokens" else 0, "maximum": top}
        if name.startswith("Ollama") and name.endswith("Request"):
            props["options"] = {"$ref": "#/components/schemas/OllamaOptions"}
            required.append("options")
        if not required:
            del schema["required"]
    if speech:
        for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            form = doc["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
            form["properties"]["model"] = {"type": "string", "enum": [speech]}
    return doc


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_and_no_undocumented_answer(fuzz_server: ServerThread, tmp_path: Path) -> None:
    # A test dependency (the `test` extra): missing, it fails here rather than skip.
    assert importlib.util.find_spec("schemathesis"), "schemathesis is missing: pip install -e '.[test]'"
    models = set(fuzz_server.registry.loaded) | set(fuzz_server.registry.oneshot)
    doc = bounded_document(
        build_document(fuzz_server.app),
        chat=MODEL_ID,
        embeddings=EMBEDDING_MODEL if EMBEDDING_MODEL in models else None,
        speech=SPEECH_MODEL if SPEECH_MODEL in models else None,
    )
    schema_path = tmp_path / "openapi.json"
    schema_path.write_text(json.dumps(doc))
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", str(schema_path),
        "--url", fuzz_server.base_url,
        "--header", f"Authorization: Bearer {API_KEY}",
        "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
        "response_headers_conformance,response_schema_conformance",
        "--phases", "examples,fuzzing",
        "--max-examples", os.environ.get("LOCALSERVE_FUZZ_EXAMPLES", "15"),
        "--mode", "all",
        "--no-shrink",
        "--request-timeout", "60",
        # One worker: Python 3.11 before 3.11.8 can raise a spurious SystemError in
        # `ast.parse` run by two threads at once (CPython gh-106905), which
        # hypothesis does while describing strategies; the server is the bottleneck anyway.
        "--workers", "1",
        "--seed", os.environ.get("LOCALSERVE_FUZZ_SEED", "1234"),
        "--exclude-path-regex", EXCLUDED_PATHS,
        *[arg for op in EXCLUDED_OPERATIONS for arg in ("--exclude-operation-id", op)],
        "--suppress-health-check", "all",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=420, cwd=tmp_path)
    output = result.stdout + result.stderr
    (tmp_path / "schemathesis.txt").write_text(output)
    assert result.returncode == 0, output[-12000:]
    summary = re.search(r"(\d+) passed", output)
    assert summary is not None and int(summary.group(1)) > 0, output[-3000:]
    print("\n" + output[output.rfind("SUMMARY") :])
    # Valid requests got through to the model (the run was not all 400s), and
    # nothing is left running.
    stats = fuzz_server.call(lambda: fuzz_server.engine.stats()[MODEL_ID])
    assert stats.total_output_tokens > 0
    assert fuzz_server.wait_in_flight(lambda n: n == 0, timeout=30) == 0
