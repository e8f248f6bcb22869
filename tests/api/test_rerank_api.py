"""`/v1/rerank` (and `/rerank`, `/v2/rerank`), `/v1/score` and the Batch API
with the default embeddings model as a bi-encoder: the real all-MiniLM-L6-v2
ranks by the cosine of query and document vectors, over HTTP and through
Cohere's own `ClientV2`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.api.harness import ServerThread, make_settings
from tests.api.test_metrics import scrape, value

pytestmark = pytest.mark.slow

MODEL = "all-minilm-l6-v2"
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Berlin is the capital of Germany.",
    "The Eiffel Tower was finished in 1889.",
    "Paris is the capital of France.",
    "France is known for its cheese and wine.",
    "Madrid is the largest city in Spain.",
]
PARIS = 2


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


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def rerank(http: httpx.Client, path: str = "/v1/rerank", **body: Any) -> dict[str, Any]:
    response = http.post(path, json={"model": MODEL, "query": QUERY, "documents": DOCUMENTS, **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


# ---- must show ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank", "/api/v1/rerank"])
def test_paris_ranks_first_on_every_path(http: httpx.Client, path: str) -> None:
    body = rerank(http, path)
    results = body["results"]
    assert results[0]["index"] == PARIS, results
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and -1.0 <= scores[-1] <= scores[0] <= 1.0
    assert body["model"] == MODEL and body["meta"]["method"] == "bi-encoder"
    assert body["usage"]["prompt_tokens"] > len(DOCUMENTS) * 3


def test_cohere_client_v2_reranks_against_the_server(server: ServerThread) -> None:
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(api_key="unused", base_url=server.base_url, timeout=120)
    response = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [r.index for r in response.results][0] == PARIS
    assert len(response.results) == 3
    assert response.results[0].relevance_score > response.results[1].relevance_score


def test_scores_are_the_cosines_of_the_embeddings(http: httpx.Client) -> None:
    import numpy as np

    body = rerank(http)
    vectors = http.post("/v1/embeddings", json={"model": MODEL, "input": [QUERY, *DOCUMENTS]}).json()["data"]
    query, *docs = (np.array(v["embedding"], np.float64) for v in vectors)
    expected = [float(query @ d / np.linalg.norm(query) / np.linalg.norm(d)) for d in docs]
    by_index = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert max(abs(by_index[i] - expected[i]) for i in range(len(docs))) < 1e-5


def test_top_n_and_return_documents(http: httpx.Client) -> None:
    body = rerank(http, top_n=2, return_documents=True)
    assert len(body["results"]) == 2
    assert body["results"][0]["document"] == {"text": DOCUMENTS[PARIS]}
    assert len(rerank(http, top_n=50)["results"]) == len(DOCUMENTS)  # more than there are: all of them
    assert "document" not in rerank(http)["results"][0]


def test_tei_texts_get_tei_s_bare_list(http: httpx.Client) -> None:
    """Hugging Face TEI's body (`texts`, `return_text`), answered in its shape, as llama-server does."""
    response = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "top_n": 2, "return_text": True})
    assert response.status_code == 200, response.text
    ranked = response.json()
    assert [item["index"] for item in ranked][:1] == [PARIS] and len(ranked) == 2
    assert ranked[0]["text"] == DOCUMENTS[PARIS] and ranked[0]["score"] >= ranked[1]["score"]
    plain = http.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "texts": DOCUMENTS}).json()
    assert sorted(item["index"] for item in plain) == list(range(len(DOCUMENTS))) and "text" not in plain[0]


def test_documents_as_text_objects(http: httpx.Client) -> None:
    body = rerank(http, documents=[{"text": d} for d in DOCUMENTS])
    assert body["results"][0]["index"] == PARIS


async def test_a_request_s_scores_do_not_depend_on_its_batchmates(server: ServerThread) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:

        async def scores(documents: list[str]) -> dict[int, float]:
            response = await client.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": documents})
            assert response.status_code == 200, response.text
            return {r["index"]: r["relevance_score"] for r in response.json()["results"]}

        alone = await scores(DOCUMENTS)
        others = [[f"{word} is a word about {n} things, said again and again" * (n % 5 + 1)] for n, word in
                  enumerate(["cat", "sea", "rain", "gold", "moon", "salt", "tree", "wind"])]  # fmt: skip
        together = await asyncio.gather(scores(DOCUMENTS), *(scores(o) for o in others))
    assert max(abs(together[0][i] - alone[i]) for i in alone) < 1e-5
    stats = server.call(lambda: server.registry.oneshot_stats())[MODEL]
    assert stats.queue.errors == 0


def test_score_pairs_as_vllm(http: httpx.Client) -> None:
    one_to_many = http.post("/v1/score", json={"model": MODEL, "text_1": QUERY, "text_2": DOCUMENTS}).json()
    scores = [d["score"] for d in one_to_many["data"]]
    assert [d["index"] for d in one_to_many["data"]] == list(range(len(DOCUMENTS)))
    assert max(range(len(scores)), key=scores.__getitem__) == PARIS
    assert one_to_many["object"] == "list" and one_to_many["data"][0]["object"] == "score"
    pairwise = http.post("/v1/score", json={"model": MODEL, "text_1": [QUERY, QUERY], "text_2": DOCUMENTS[1:3]})
    assert [round(d["score"], 5) for d in pairwise.json()["data"]] == [round(s, 5) for s in scores[1:3]]


def test_a_long_document_is_cut_and_the_answer_says_so(http: httpx.Client) -> None:
    documents = [*DOCUMENTS, "Paris " + "and more words " * 400]
    body = rerank(http, documents=documents)
    assert body["meta"]["truncated_documents"] == [len(DOCUMENTS)]
    assert "cut" in body["meta"]["warnings"][0]
    response = http.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": documents, "truncate": False})
    assert response.status_code == 400 and response.json()["error"]["param"] == f"documents[{len(DOCUMENTS)}]"


# ---- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "param", "fragment"),
    [
        ("/v1/rerank", {"query": QUERY, "documents": []}, "documents", "at least 1"),
        ("/v1/rerank", {"query": QUERY, "documents": ["x"] * 1001}, "documents", "at most 1000"),
        ("/v1/rerank", {"query": QUERY, "documents": ["x"], "top_n": 0}, "top_n", "greater than or equal to 1"),
        ("/v1/rerank", {"query": "", "documents": ["x"]}, "query", "at least 1"),
        ("/v1/rerank", {"query": QUERY, "documents": ["ok", ""]}, "documents[1]", "empty string"),
        ("/v1/rerank", {"query": QUERY, "documents": [1, 2]}, "documents[0]", "string"),
        ("/v1/rerank", {"query": QUERY}, None, "'documents'"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"], "texts": ["b"]}, None, "not both"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, None, "as many as text_2"),
        ("/v1/classify", {"input": "hello"}, "model", "not a classify or rerank model"),
    ],
)
def test_bad_requests_get_one_clear_4xx(
    http: httpx.Client, path: str, body: dict[str, Any], param: str | None, fragment: str
) -> None:
    response = http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert fragment in error["message"], error
    if param is not None:
        assert error["param"] == param, error


def test_an_unknown_name_falls_back_to_the_one_model(http: httpx.Client) -> None:
    """As llama-server with one model (and /v1/embeddings here): the only model that can rerank answers."""
    response = http.post("/v1/rerank", json={"model": "nope", "query": QUERY, "documents": DOCUMENTS})
    assert response.status_code == 200 and response.json()["results"][0]["index"] == PARIS
    nameless = http.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS})  # llama-server's clients
    assert nameless.status_code == 200 and nameless.json()["model"] == MODEL


# ---- listed, counted, batched -------------------------------------------------------------


def test_v1_models_labels_it_a_bi_encoder(http: httpx.Client) -> None:
    http.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCUMENTS})
    listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert listed[MODEL]["meta"]["rerank"] == "bi-encoder"


def test_metrics_count_rerank_requests(http: httpx.Client) -> None:
    labels = {"model": MODEL, "endpoint": "/v1/rerank", "status": "200"}
    before = value(scrape(http), "localserve_requests_total", **labels)
    rerank(http)
    assert value(scrape(http), "localserve_requests_total", **labels) == before + 1


def test_the_openapi_document_declares_the_routes(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    for path in ("/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/v1/classify"):
        assert "post" in paths[path], path


def test_the_batch_api_runs_rerank_lines(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    lines = [
        {"custom_id": "r0", "method": "POST", "url": "/v1/rerank",
         "body": {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": 1}},
        {"custom_id": "r1", "method": "POST", "url": "/v1/rerank",
         "body": {"model": MODEL, "query": "Which city is in Spain?", "documents": DOCUMENTS}},
        {"custom_id": "bad", "method": "POST", "url": "/v1/rerank", "body": {"model": MODEL, "query": QUERY}},
    ]  # fmt: skip
    text = "".join(json.dumps(line) + "\n" for line in lines)
    file_id = client.files.create(file=("rerank.jsonl", text.encode()), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/rerank", completion_window="24h")  # type: ignore[arg-type]
    deadline = time.monotonic() + 300
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    answers = {}
    for name in ("output_file_id", "error_file_id"):
        if getattr(batch, name):
            for line in client.files.content(getattr(batch, name)).text.splitlines():
                answer = json.loads(line)
                answers[answer["custom_id"]] = answer["response"]
    assert answers["r0"]["status_code"] == 200 and answers["r0"]["body"]["results"][0]["index"] == PARIS
    assert len(answers["r0"]["body"]["results"]) == 1
    assert answers["r1"]["body"]["results"][0]["index"] == 4  # Madrid
    assert answers["bad"]["status_code"] == 400
