"""Rerank, score and classify as the retrieval servers speak them: the
request bodies and the answers of `/v1/rerank` (llama-server's, Jina's and
Cohere's v2 shape), `/v1/score` and `/v1/classify` (vLLM's), over
`serving.rerank`. The endpoints and batch lines both answer through here."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from localserve.engine.types import parse_priority
from localserve.jobs.types import new_id
from localserve.serving.models import ModelHost
from localserve.serving.openai.embeddings import usage_tokens
from localserve.serving.openai.schemas import Priority
from localserve.serving.rerank import ClassifyRequest, PairScores, PairsRequest, classify, score_pairs

MAX_DOCUMENTS = 1000  # documents per rerank, pairs per score, inputs per classify


class TextDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = ""  # "": the only model of its kind this server runs (serving/models.py)
    #: A text longer than the model reads: cut it (the answer's `meta` names
    #: it), or with false, a 400.
    truncate: bool = True
    priority: Priority = None


class RerankRequest(_Body):
    """llama-server's, Jina's and Cohere's v2 body (`documents`), or Hugging
    Face TEI's (`texts`, answered in TEI's shape: a bare list of `{index,
    score, text?}`), as llama-server takes both."""

    query: str = Field(min_length=1)
    documents: list[str | TextDocument] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS)
    texts: list[str] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS)  # TEI
    top_n: int | None = Field(default=None, ge=1)  # more than the documents: all of them
    return_documents: bool = False
    return_text: bool = False  # TEI's name for return_documents

    @model_validator(mode="after")
    def _check_documents(self) -> RerankRequest:
        if (self.documents is None) == (self.texts is None):
            raise ValueError("send the documents to rank as 'documents' (or TEI's 'texts'), not both")
        return self

    @property
    def tei(self) -> bool:
        """The request came in Hugging Face TEI's form (`texts`)."""
        return self.texts is not None

    def document_texts(self) -> tuple[str, ...]:
        if self.texts is not None:
            return tuple(self.texts)
        return tuple(d if isinstance(d, str) else d.text for d in self.documents or ())


def _texts(value: str | list[str], name: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise ValueError(f"{name} must not be an empty list")
    if len(texts) > MAX_DOCUMENTS:
        raise ValueError(f"at most {MAX_DOCUMENTS} texts in {name}; got {len(texts)}")
    return texts


class ScoreRequest(_Body):
    """vLLM's: one text_1 against each text_2, or pairwise when both are lists."""

    text_1: str | list[str]
    text_2: str | list[str]

    @model_validator(mode="after")
    def _check_pairs(self) -> ScoreRequest:
        firsts, seconds = _texts(self.text_1, "text_1"), _texts(self.text_2, "text_2")
        if len(firsts) > 1 and len(firsts) != len(seconds):
            raise ValueError(
                f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: send one text_1, or as many as text_2"
            )
        return self


class ClassifyBody(_Body):
    input: str | list[str]

    @field_validator("input")
    @classmethod
    def _check_input(cls, value: str | list[str]) -> str | list[str]:
        _texts(value, "input")
        return value


async def rerank(host: ModelHost, body: RerankRequest) -> dict[str, Any]:
    """The rerank answer: `results` sorted by relevance, best first."""
    documents = body.document_texts()
    request = PairsRequest(body.model, (body.query,), documents, parse_priority(body.priority), body.truncate)
    scored = await score_pairs(host, request)
    order = sorted(range(len(documents)), key=lambda i: -scored.scores[i])[: body.top_n]
    results: list[dict[str, Any]] = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scored.scores[i]}
        if body.return_documents or body.return_text:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return {
        "id": new_id("rerank-"),
        "object": "list",
        "model": scored.model_id,  # the model that served it (a fallback may differ from the name asked)
        "results": results,
        "usage": usage_tokens(scored.num_tokens),
        "meta": _meta(scored, "documents"),
    }


def tei_answer(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """A rerank answer in Hugging Face TEI's shape: a bare list of `{index,
    score, text?}`, best first, as llama-server answers a `texts` request."""
    ranked = []
    for result in answer["results"]:
        item = {"index": result["index"], "score": result["relevance_score"]}
        if "document" in result:
            item["text"] = result["document"]["text"]
        ranked.append(item)
    return ranked


async def score(host: ModelHost, body: ScoreRequest) -> dict[str, Any]:
    """One score per pair, in pair order."""
    firsts = tuple(_texts(body.text_1, "text_1"))
    seconds = tuple(_texts(body.text_2, "text_2"))
    request = PairsRequest(
        body.model, firsts, seconds, parse_priority(body.priority), body.truncate, "text_1", "text_2"
    )
    scored = await score_pairs(host, request)
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scored.scores)]
    return {
        "id": new_id("score-"),
        "object": "list",
        "created": int(time.time()),
        "model": scored.model_id,
        "data": data,
        "usage": usage_tokens(scored.num_tokens),
        "meta": _meta(scored, "text_2"),
    }


async def classify_texts(host: ModelHost, body: ClassifyBody) -> dict[str, Any]:
    """Each input's most likely label and its probabilities over all labels."""
    inputs = tuple(_texts(body.input, "input"))
    result = await classify(host, ClassifyRequest(body.model, inputs, parse_priority(body.priority), body.truncate))
    data = []
    for i, probs in enumerate(result.probs):
        best = int(probs.argmax()) if len(probs) > 1 else 0
        data.append({"index": i, "label": result.labels[best], "probs": probs.tolist(), "num_classes": len(probs)})
    answer: dict[str, Any] = {
        "id": new_id("classify-"),
        "object": "list",
        "created": int(time.time()),
        "model": result.model_id,
        "data": data,
        "usage": usage_tokens(result.num_tokens),
        "meta": {"labels": list(result.labels)},
    }
    if result.truncated:
        answer["meta"]["truncated_inputs"] = result.truncated
        answer["meta"]["warnings"] = [_cut_warning(result.truncated, "input")]
    return answer


def _meta(scored: PairScores, what: str) -> dict[str, Any]:
    """How the scores were made, and which texts were cut to fit the model."""
    meta: dict[str, Any] = {"method": scored.method}
    if scored.truncated:
        meta[f"truncated_{what}"] = scored.truncated
        meta["warnings"] = [_cut_warning(scored.truncated, what)]
    return meta


def _cut_warning(indices: list[int], what: str) -> str:
    shown = ", ".join(map(str, indices[:10])) + (", ..." if len(indices) > 10 else "")
    return f"{len(indices)} of the {what} were longer than the model reads and were cut to fit: {shown}"
