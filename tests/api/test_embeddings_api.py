"""`POST /v1/embeddings` over HTTP, with the official openai SDK, against the
real all-MiniLM-L6-v2 (converted on load into a temporary store: the int8 ONNX graph, else GGUF)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.api.harness import ServerThread, make_settings
from tests.api.test_metrics import scrape, value

pytestmark = pytest.mark.slow

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(tmp_path_factory.mktemp("localserve-home")))
        srv = ServerThread(make_settings(models=[MODEL], threads=1)).start()
        try:
            srv.wait_healthy(timeout=180)
            yield srv
        finally:
            srv.stop()


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.array([d.embedding for d in sorted(response.data, key=lambda d: d.index)], dtype=np.float32)


def sentences(count: int) -> list[str]:
    rng = np.random.default_rng(11)
    vocab = [
        "a",
        "the",
        "man",
        "woman",
        "child",
        "dog",
        "is",
        "was",
        "eating",
        "reading",
        "playing",
        "bread",
        "food",
        "drums",
        "music",
        "in",
        "at",
        "park",
        "home",
    ]
    return [" ".join(rng.choice(vocab, size=int(rng.integers(2, 30)))) for _ in range(count)]


# ---- must show -------------------------------------------------------------------------


def test_food_is_closer_to_bread_than_to_drums(client: openai.OpenAI) -> None:
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "A monkey is playing drums."]
    food, bread, drums = vectors(client.embeddings.create(model=MODEL, input=texts, encoding_format="float"))
    assert float(food @ bread) > float(food @ drums)
    assert float(food @ bread) > 0.6 and float(food @ drums) < 0.2


def test_float_and_base64_agree(client: openai.OpenAI, http: httpx.Client) -> None:
    texts = ["The cat sat on the mat.", "Quantum chromodynamics"]
    floats = vectors(client.embeddings.create(model=MODEL, input=texts, encoding_format="float"))
    sdk_default = vectors(client.embeddings.create(model=MODEL, input=texts))  # the SDK asks for base64
    raw = http.post("/v1/embeddings", json={"model": MODEL, "input": texts, "encoding_format": "base64"}).json()
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]])
    assert decoded.shape == (2, 384)
    np.testing.assert_array_equal(decoded, floats)
    np.testing.assert_array_equal(sdk_default, floats)


def test_a_batch_of_64_inputs_equals_one_by_one(client: openai.OpenAI) -> None:
    texts = sentences(64)
    batched = vectors(client.embeddings.create(model=MODEL, input=texts, encoding_format="float"))
    one_by_one = np.stack(
        [vectors(client.embeddings.create(model=MODEL, input=t, encoding_format="float"))[0] for t in texts]
    )
    cosines = np.sum(batched * one_by_one, axis=1) / (
        np.linalg.norm(batched, axis=1) * np.linalg.norm(one_by_one, axis=1)
    )
    assert cosines.min() > 0.999


# ---- the request shapes ------------------------------------------------------------------


def test_token_lists_embed_like_their_text(client: openai.OpenAI, http: httpx.Client) -> None:
    text = "A man is eating food."
    ids = [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]  # its WordPiece tokens, with [CLS] and [SEP]
    from_text = vectors(client.embeddings.create(model=MODEL, input=text, encoding_format="float"))[0]
    one = http.post("/v1/embeddings", json={"model": MODEL, "input": ids}).json()
    many = http.post("/v1/embeddings", json={"model": MODEL, "input": [ids, ids[:4]]}).json()
    np.testing.assert_allclose(one["data"][0]["embedding"], from_text, atol=1e-6)
    np.testing.assert_allclose(many["data"][0]["embedding"], from_text, atol=1e-6)
    assert len(many["data"]) == 2 and many["usage"] == {"prompt_tokens": 12, "total_tokens": 12}


def test_the_answer_has_openai_s_shape_and_usage(http: httpx.Client) -> None:
    body = http.post(
        "/api/v1/embeddings", json={"model": MODEL, "input": ["one two", "three"], "dimensions": 384}
    ).json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}  # [CLS] one two [SEP] + [CLS] three [SEP]
    assert abs(np.linalg.norm(body["data"][0]["embedding"]) - 1.0) < 1e-5


async def test_concurrent_requests_share_batches(server: ServerThread) -> None:
    aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    texts = sentences(32)
    results = await asyncio.gather(*(aclient.embeddings.create(model=MODEL, input=t) for t in texts))
    assert all(len(r.data) == 1 for r in results)
    stats = server.call(lambda: server.registry.oneshot_stats())[MODEL]
    assert stats.kind == "embeddings" and stats.queue.max_batch_size_seen > 1 and stats.queue.errors == 0
    snapshot = httpx.get(f"{server.base_url}/api/v1/stats", timeout=30).json()
    assert snapshot["one_shot"][MODEL]["max_batch_size_seen"] > 1


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"model": MODEL, "input": []}, "input", "empty"),
        ({"model": MODEL, "input": "x", "dimensions": 128}, "dimensions", "384"),
        ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format", ""),
        ({"model": MODEL, "input": [101, 99999, 102]}, "input", "vocabulary"),
        ({"model": MODEL, "input": "x", "priority": "urgent"}, "priority", "priority"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(http: httpx.Client, body: dict, param: str, fragment: str) -> None:
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"]
    assert error["type"] == "invalid_request_error"


def test_an_input_over_the_window_is_too_large(http: httpx.Client) -> None:
    response = http.post("/v1/embeddings", json={"model": MODEL, "input": ["ok", "word " * 600]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[1]" and "too large" in error["message"] and "at most 512 tokens" in error["message"]
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 512 and error["n_prompt_tokens"] > 512


def test_empty_text_and_mixed_prompts_embed_as_llama_server(http: httpx.Client) -> None:
    """An empty text is the special tokens alone; token ids may hold text pieces ([12, "text", 13])."""
    for given, count in (("", 1), (["ok", ""], 2), ([2023, "is a", 3231], 1), (["a test", [2023, "is a", 3231]], 2)):
        response = http.post("/v1/embeddings", json={"model": MODEL, "input": given})
        assert response.status_code == 200, response.text
        assert len(response.json()["data"]) == count
    whole = http.post("/v1/embeddings", json={"model": MODEL, "input": "this is a test"}).json()
    mixed = http.post("/v1/embeddings", json={"model": MODEL, "input": [101, 2023, "is a", 3231, 102]}).json()
    assert whole["usage"]["prompt_tokens"] == mixed["usage"]["prompt_tokens"] == 6
    assert np.allclose(whole["data"][0]["embedding"], mixed["data"][0]["embedding"], atol=1e-5)


def test_no_or_an_unknown_model_means_the_only_embeddings_model(http: httpx.Client) -> None:
    """As llama-server: one embeddings model serves `text-embedding-3-small` and no name alike."""
    for body in ({"model": "text-embedding-3-small", "input": "x"}, {"input": "x"}):
        response = http.post("/v1/embeddings", json=body)
        assert response.status_code == 200 and response.json()["model"] == MODEL
    # No chat model here to fall back to: an unknown chat model stays a 404.
    chat = http.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"


def test_mixed_lists_and_llama_servers_native_embeddings(client: openai.OpenAI, http: httpx.Client) -> None:
    text = "A man is eating food."
    ids = [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]
    from_text = vectors(client.embeddings.create(model=MODEL, input=text))[0]
    mixed = http.post("/v1/embeddings", json={"model": MODEL, "input": [text, ids]}).json()
    np.testing.assert_allclose(mixed["data"][1]["embedding"], from_text, atol=1e-6)
    for path, body in (("/embeddings", {"content": text}), ("/embedding", {"input": [text, ids]})):
        native = http.post(path, json=body).json()  # [{index, embedding: [[...]]}], no model named
        assert [item["index"] for item in native] == list(range(len(native)))
        for item in native:
            np.testing.assert_allclose(item["embedding"][0], from_text, atol=1e-6)


def test_llama_server_object_entries(client: openai.OpenAI, http: httpx.Client) -> None:
    text = "A man is eating food."
    from_text = vectors(client.embeddings.create(model=MODEL, input=text))[0]
    parts = {"content": [{"type": "text", "text": "A man is "}, {"type": "text", "text": "eating food."}]}
    body = {"model": MODEL, "input": [{"prompt_string": text}, parts]}
    data = http.post("/v1/embeddings", json=body).json()["data"]
    for item in data:
        np.testing.assert_allclose(item["embedding"], from_text, atol=1e-6)
    single = http.post("/v1/embeddings", json={"model": MODEL, "input": parts}).json()["data"]
    assert len(single) == 1
    for bad in ({"content": "text"}, {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}):
        assert http.post("/v1/embeddings", json={"model": MODEL, "input": bad}).status_code == 400


def test_chat_on_an_embeddings_model_says_where_to_go(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400 and "/v1/embeddings" in response.json()["error"]["message"]


def test_an_onnx_converted_model_serves_the_same_vectors(client: openai.OpenAI, tmp_path_factory) -> None:
    from localserve.models.convert.bert_onnx import cached_onnx
    from localserve.models.registry import resolve

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(tmp_path_factory.mktemp("onnx-home")))
        path = cached_onnx(resolve(MODEL).path, MODEL, variant="int8")  # the graph the catalog id runs
    srv = ServerThread(make_settings(models=[f"minilm-onnx={path}"], threads=2)).start()
    try:
        srv.wait_healthy(timeout=120)
        onnx_client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        texts = sentences(12)
        from_onnx = vectors(onnx_client.embeddings.create(model="minilm-onnx", input=texts))
        stats = srv.call(lambda: srv.registry.oneshot_stats())["minilm-onnx"]
        assert stats.queue.padding_free is False and stats.queue.items == 12
    finally:
        srv.stop()
    from_catalog_id = vectors(client.embeddings.create(model=MODEL, input=texts))
    assert np.min(np.sum(from_onnx * from_catalog_id, axis=1)) > 0.9999


def test_pooling_none_gives_a_vector_per_token_on_the_native_routes_only(
    client: openai.OpenAI, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """llama-server's --pooling none: the model loads on llama.cpp, and /embedding(s) answer each token's
    vector as the model gives it (not normalised); the routes of pooled vectors refuse it with a 400."""
    text = "hello hello hello"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(tmp_path_factory.mktemp("pooling-none-home")))
        srv = ServerThread(make_settings(models=[MODEL], threads=2, pooling="none")).start()
        try:
            srv.wait_healthy(timeout=180)
            with httpx.Client(base_url=srv.base_url, timeout=120) as none:
                answer = none.post("/embeddings", json={"input": [text, "hello"]})
                assert answer.status_code == 200, answer.text
                rows = [np.array(item["embedding"], dtype=np.float32) for item in answer.json()]
                assert [r.shape for r in rows] == [(5, 384), (3, 384)]  # [CLS] hello x3 [SEP]; [CLS] hello [SEP]
                assert all(abs(float(np.linalg.norm(v)) - 1) > 1e-3 for r in rows for v in r)
                for path, body in (
                    ("/v1/embeddings", {"model": MODEL, "input": text}),
                    ("/api/embed", {"model": MODEL, "input": text}),
                ):
                    refused = none.post(path, json=body)
                    assert refused.status_code == 400 and "pooling none" in refused.text, (path, refused.text)
            stats = srv.call(lambda: srv.registry.oneshot_stats())[MODEL]
            assert stats.queue.padding_free is True  # llama.cpp, not the ONNX graph the catalog id runs
        finally:
            srv.stop()
    # MiniLM pools by the mean over its tokens: the mean of the rows is the model's sentence vector.
    mean = rows[0].mean(axis=0)
    pooled = vectors(client.embeddings.create(model=MODEL, input=text))[0]
    assert float(np.dot(mean / np.linalg.norm(mean), pooled)) > 0.99


# ---- listed and counted like any model -------------------------------------------------------


def test_the_model_is_listed_in_v1_models_and_api_tags(client: openai.OpenAI, http: httpx.Client) -> None:
    listed = {m.id: m for m in client.models.list().data}
    assert MODEL in listed, list(listed)
    assert listed[MODEL].model_extra["meta"]["kind"] == "embeddings"
    one = http.get(f"/v1/models/{MODEL}")
    assert one.status_code == 200 and one.json()["id"] == MODEL and one.json()["meta"]["kind"] == "embeddings"
    assert MODEL in [m["name"] for m in http.get("/api/tags").json()["models"]]


def test_metrics_count_requests_under_the_model(client: openai.OpenAI, http: httpx.Client) -> None:
    labels = {"model": MODEL, "endpoint": "/v1/embeddings", "status": "200"}
    before = value(scrape(http), "localserve_requests_total", **labels)
    client.embeddings.create(model=MODEL, input="counted")
    assert value(scrape(http), "localserve_requests_total", **labels) == before + 1
    # An unknown model is not a label value (clients could make up any number of them).
    # With one embeddings model it answers (as llama-server); the count is under the model that served it.
    assert http.post("/v1/embeddings", json={"model": "no-such-model", "input": "x"}).status_code == 200
    assert all(dict(key).get("model") != "no-such-model" for key in scrape(http)["localserve_requests_total"])
