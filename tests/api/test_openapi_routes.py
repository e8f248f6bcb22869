"""The route declarations (`api/routes.py`) are the router and the OpenAPI
document both: every operation the document had when it was built from
handler source is still there, nothing is routed that is not declared, and
the document is a valid OpenAPI 3.1 document. No model is loaded."""

from __future__ import annotations

import inspect
import re

import pytest
from openapi_spec_validator import validate

from localserve.api.admin.openapi import build_document
from localserve.api.routes import declared_routes
from tests.tui.live import empty_app

#: (method, path) of every operation, as the document listed them before the declarations.
OPERATIONS = {
    # llama-server's own and unprefixed routes (api/llamacpp/, issue 44)
    ("GET", "/models"),
    ("GET", "/models/{model_id}"),
    ("GET", "/props"),
    ("GET", "/slots"),
    ("POST", "/apply-template"),
    ("POST", "/chat/completions"),
    ("POST", "/chat/completions/input_tokens"),
    ("POST", "/completion"),
    ("POST", "/completions"),
    ("POST", "/detokenize"),
    ("POST", "/embedding"),
    ("POST", "/embeddings"),
    ("POST", "/responses"),
    ("POST", "/slots/{id_slot}"),
    ("POST", "/tokenize"),
    ("DELETE", "/api/delete"),
    ("DELETE", "/api/v1/files/{file_id}"),
    ("DELETE", "/api/v1/models/{model_id}"),
    ("DELETE", "/v1/files/{file_id}"),
    ("DELETE", "/v1/models/{model_id}"),
    ("GET", "/"),
    ("GET", "/api/ps"),
    ("GET", "/api/tags"),
    ("GET", "/api/v1/batches"),
    ("GET", "/api/v1/batches/{batch_id}"),
    ("GET", "/api/v1/files"),
    ("GET", "/api/v1/files/{file_id}"),
    ("GET", "/api/v1/files/{file_id}/content"),
    ("GET", "/api/v1/loaded"),
    ("GET", "/api/v1/models"),
    ("GET", "/api/v1/models/{model_id}"),
    ("GET", "/api/v1/stats"),
    ("GET", "/api/v1/stats/stream"),
    ("GET", "/api/version"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/ui/{name}"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("POST", "/api/chat"),
    ("POST", "/api/copy"),
    ("POST", "/api/embed"),
    ("POST", "/api/embeddings"),
    ("POST", "/api/generate"),
    ("POST", "/api/pull"),
    ("POST", "/api/show"),
    ("POST", "/api/v1/audio/transcriptions"),
    ("POST", "/api/v1/audio/translations"),
    ("POST", "/api/v1/batches"),
    ("POST", "/api/v1/batches/{batch_id}/cancel"),
    ("POST", "/api/v1/chat/completions"),
    ("POST", "/api/v1/chat/completions/input_tokens"),
    ("POST", "/api/v1/classify"),
    ("POST", "/api/v1/completions"),
    ("POST", "/api/v1/embeddings"),
    ("POST", "/api/v1/files"),
    ("POST", "/api/v1/load"),
    ("POST", "/api/v1/messages"),
    ("POST", "/api/v1/messages/count_tokens"),
    ("POST", "/api/v1/pull"),
    ("POST", "/api/v1/requests/{request_id}/cancel"),
    ("POST", "/api/v1/rerank"),
    ("POST", "/api/v1/responses"),
    ("POST", "/api/v1/score"),
    ("POST", "/api/v1/unload"),
    ("POST", "/infill"),
    ("POST", "/rerank"),
    ("POST", "/v1/audio/transcriptions"),
    ("POST", "/v1/audio/translations"),
    ("POST", "/v1/batches"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/chat/completions/input_tokens"),
    ("POST", "/v1/classify"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/files"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/rerank"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/score"),
    ("POST", "/v2/rerank"),
}


@pytest.fixture(scope="module")
def app():  # type: ignore[no-untyped-def]
    return empty_app(api_key="k")


def test_the_document_keeps_every_operation(app) -> None:  # type: ignore[no-untyped-def]
    doc = build_document(app)
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == OPERATIONS, documented ^ OPERATIONS


def test_the_router_holds_exactly_the_declared_routes(app) -> None:  # type: ignore[no-untyped-def]
    declared = [(r.method, r.canonical) for r in declared_routes(app)]
    assert len(declared) == len(set(declared))  # each route declared once
    routed = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    assert routed == set(declared)


def test_a_declared_body_is_the_model_its_handler_validates_with(app) -> None:  # type: ignore[no-untyped-def]
    for route in declared_routes(app):
        source = inspect.getsource(route.handler)
        parsed = re.findall(r"parse_body\(\s*request\s*,\s*([\w.]+)\s*\)", source)
        named = [name.rsplit(".", 1)[-1] for name in parsed]
        expected = [route.body.__name__] if route.body is not None else []
        assert named == expected, (route.method, route.path)


def test_the_document_is_valid_openapi(app) -> None:  # type: ignore[no-untyped-def]
    doc = build_document(app)
    validate(doc)
    assert doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert [p["name"] for p in doc["paths"]["/v1/files"]["get"]["parameters"]] == ["order", "limit", "purpose", "after"]
    assert "multipart/form-data" in doc["paths"]["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]
    assert doc["paths"]["/health"]["get"]["security"] == []
