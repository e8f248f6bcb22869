"""A sentence-transformers BERT folder as an ONNX graph for ONNX Runtime,
built node by node with `onnx.helper` from the safetensors weights: no torch.

The graph takes `input_ids` and `attention_mask` ([batch, tokens], int64,
right-padded) and returns `embeddings` ([batch, hidden]): BERT, then the
folder's pooling (mean over real tokens, or CLS), then L2 normalisation if
the folder has a `Normalize` module. The WordPiece tokenizer is copied
beside it as `<stem>.tokenizer.json`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from localserve.models.convert.bert_onnx_fused import FusedGraph
from localserve.models.convert.bert_onnx_graph import Graph, embeddings_properties
from localserve.models.convert.bert_onnx_int8 import RowInt8Graph
from localserve.models.convert.cache import (
    Progress,
    SentenceTransformersModel,
    read_sentence_transformers,
    store_target,
    write_atomically,
)

#: graph variant -> the file suffix in the store. `plain`: standard operators
#: only (what OpenVINO converts); `fused`: ONNX Runtime's contrib operators
#: (bert_onnx_fused.py), the same arithmetic; `int8`: `fused` with every
#: projection in int8, activations quantized per token (bert_onnx_int8.py;
#: checked against `fused` by the tests).
VARIANTS = {"plain": "f32.onnx", "fused": "f32-fused.onnx", "int8": "int8-rows.onnx"}


def tokenizer_path(onnx_path: Path) -> Path:
    return onnx_path.with_name(onnx_path.stem + ".tokenizer.json")


def cached_onnx(
    source: Path, name: str, *, variant: str = "plain", force: bool = False, progress: Progress | None = None
) -> Path:
    """The ONNX graph (`variant` of VARIANTS) of the folder `source`, built now
    unless the store has it."""
    model = read_sentence_transformers(source)
    target = store_target(model, name, VARIANTS[variant])
    if target.is_file() and tokenizer_path(target).is_file() and not force:
        return target
    write_atomically(tokenizer_path(target), lambda tmp: shutil.copyfile(model.path / "tokenizer.json", tmp))
    return write_atomically(target, lambda tmp: _write_graph(model, tmp, graph_class(variant), progress))


def graph_class(variant: str) -> type[Graph]:
    return {"fused": FusedGraph, "int8": RowInt8Graph}.get(variant, Graph)


#: What follows the encoder: adds the graph's outputs, returns its ONNX metadata.
Head = Callable[[Graph, str, int], dict[str, str]]


def embeddings_head(model: SentenceTransformersModel) -> Head:
    """The folder's pooling, then L2 normalisation if it has a `Normalize` module."""

    def head(graph: Graph, x: str, hidden: int) -> dict[str, str]:
        pooled = graph.pool(x, model.pooling)
        graph.output(graph.normalize(pooled) if model.normalize else pooled, hidden)
        return embeddings_properties(model)

    return head


def _write_graph(
    model: SentenceTransformersModel, path: Path, graph_class: type[Graph], progress: Progress | None
) -> None:
    from safetensors.numpy import load_file

    write_encoder_graph(
        model.config, load_file(str(model.weights)), path, graph_class, embeddings_head(model), progress
    )


def write_encoder_graph(
    config: dict[str, Any],
    weights: dict[str, np.ndarray],
    path: Path,
    graph_class: type[Graph],
    head: Head,
    progress: Progress | None,
    *,
    token_types: bool = False,
) -> None:
    """BERT (`weights` named as `BertModel` names them), then `head`, saved as ONNX at `path`."""
    import onnx

    graph = graph_class(weights, token_types=token_types)
    c = config
    num_layers, num_heads, hidden = int(c["num_hidden_layers"]), int(c["num_attention_heads"]), int(c["hidden_size"])
    eps = float(c.get("layer_norm_eps", 1e-12))
    x, mask = graph.embeddings(eps)
    for layer in range(num_layers):
        if progress is not None:
            progress(f"encoder.layer.{layer}", layer, num_layers)
        x = graph.layer(x, mask, f"encoder.layer.{layer}", num_heads, hidden // num_heads, eps)
    onnx_model = graph.build(head(graph, x, hidden))
    onnx.checker.check_model(onnx_model)
    onnx.save(onnx_model, str(path))
    if progress is not None:
        progress("done", num_layers, num_layers)
