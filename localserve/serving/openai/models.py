"""OpenAI's model objects (`GET /v1/models`, `GET /v1/models/{id}`) from
the registry's models, without HTTP: a loaded generative or one-shot model,
a model on this machine that a request would load, and the `localserve`
block model pickers read."""

from __future__ import annotations

from typing import Any

from localserve.engine.types import Capacity
from localserve.models.catalog import variant_of
from localserve.models.kinds import ModelKind
from localserve.models.registry import LoadedModel, LoadedOneShot


def model_object(model_id: str, loaded: LoadedModel, capacity: Capacity) -> dict[str, Any]:
    """A generative model, as `/v1/models` lists it (`capacity`: its context and slots)."""
    info = loaded.backend.info()
    return {
        "id": model_id,
        "object": "model",
        "created": int(loaded.loaded_at),
        "owned_by": "localserve",
        "meta": {
            "backend": info.backend,
            "device": info.device,
            "architecture": info.architecture,
            "num_params": info.num_params,
            "n_ctx": capacity.n_ctx,
            "n_ctx_train": info.n_ctx_train,
            "max_num_seqs": capacity.num_slots,
            "kind": ModelKind.CHAT,  # generative; one-shot models say "embeddings" or "transcription"
            "labels": list(loaded.spec.labels),
        },
    }


def oneshot_object(model_id: str, loaded: LoadedOneShot) -> dict[str, Any]:
    """An embeddings or speech model, as `/v1/models` lists it: `meta.kind`
    says which route takes it (no context or slots: it runs in batches)."""
    info = loaded.backend.info()
    return {
        "id": model_id,
        "object": "model",
        "created": int(loaded.loaded_at),
        "owned_by": "localserve",
        "meta": {
            "kind": loaded.kind,
            "backend": info.backend,
            "device": info.device,
            "architecture": info.architecture,
            "num_params": info.num_params,
            "n_ctx_train": info.n_ctx_train,
            "labels": list(loaded.spec.labels),
            **_rerank_method(loaded.kind),
        },
    }


def _rerank_method(kind: ModelKind) -> dict[str, str]:
    """How a model reranks (`/v1/rerank`), if it does: an embeddings model by
    the cosine of its vectors (a bi-encoder), a rerank model by reading query
    and document together (a cross-encoder)."""
    methods = {ModelKind.EMBEDDINGS: "bi-encoder", ModelKind.RERANK: "cross-encoder"}
    return {"rerank": methods[kind]} if kind in methods else {}


def picker_block(item: dict[str, Any], known_ids: list[str]) -> dict[str, Any]:
    """What a model picker groups by (documented in the README's model list section)."""
    meta = item["meta"]
    return {
        "kind": str(meta["kind"]),
        "backend": meta.get("backend", ""),
        "loaded": bool(meta.get("loaded")),
        "variant_of": variant_of(item["id"], known_ids),
    }


def servable_object(row: dict[str, Any]) -> dict[str, Any]:
    """A model on this machine that is not loaded (a request loads it)."""
    return {
        "id": row["id"],
        "object": "model",
        "created": 0,
        "owned_by": "localserve",
        "meta": {
            "kind": row["kind"],
            "loaded": False,
            "backend": row["backend"],
            "source": row["source"],
            "labels": row["labels"],
            "size_bytes": row["size_bytes"],
            **_rerank_method(row["kind"]),
        },
    }
