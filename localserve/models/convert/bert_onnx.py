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
from pathlib import Path

from localserve.models.convert.bert_onnx_fused import FusedGraph
from localserve.models.convert.bert_onnx_graph import Graph
from localserve.models.convert.cache import (
    Progress,
    SentenceTransformersModel,
    read_sentence_transformers,
    store_target,
    write_atomically,
)

#: graph variant -> the file suffix in the store. `plain`: standard operators
#: only (what OpenVINO converts); `fused`: ONNX Runtime's contrib operators
#: (bert_onnx_fused.py), the same arithmetic; `int8`: `fused` with its weights
#: quantized to int8 (dynamic quantization; checked against `fused` by the tests).
VARIANTS = {"plain": "f32.onnx", "fused": "f32-fused.onnx", "int8": "int8-fused.onnx"}


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
    if variant == "int8":
        fused = cached_onnx(source, name, variant="fused", force=force, progress=progress)
        return write_atomically(target, lambda tmp: _quantize(fused, tmp))
    return write_atomically(target, lambda tmp: _write_graph(model, tmp, _graph_class(variant), progress))


def _graph_class(variant: str) -> type[Graph]:
    if variant == "fused":
        return FusedGraph
    return Graph


def _quantize(source: Path, path: Path) -> None:
    """int8 weights (one scale per output channel) on the feed-forward input
    MatMuls (384 -> 1536 in MiniLM), activations quantized per call
    (onnxruntime.quantization). Measured against float32 on the fixed texts of
    tests/models/test_bert_onnx_variants.py, in padded batches of mixed
    lengths (the activation scale is per batch): every MatMul int8 gave
    cosine down to 0.986, all but the feed-forward outputs 0.990, these
    alone 0.991; one scale per weight tensor 0.84."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source), load_external_data=False).graph
    others = [n.name for n in graph.node if n.op_type == "MatMul" and ".intermediate." not in n.input[1]]
    quantize_dynamic(
        source,
        path,
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=others,
        per_channel=True,
        weight_type=QuantType.QInt8,
        # Shape inference cannot see through the contrib operators: every tensor is float.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def _write_graph(
    model: SentenceTransformersModel, path: Path, graph_class: type[Graph], progress: Progress | None
) -> None:
    import onnx
    from safetensors.numpy import load_file

    weights = load_file(str(model.weights))
    graph = graph_class(weights)
    c = model.config
    num_layers, num_heads, hidden = int(c["num_hidden_layers"]), int(c["num_attention_heads"]), int(c["hidden_size"])
    eps = float(c.get("layer_norm_eps", 1e-12))
    x, mask = graph.embeddings(eps)
    for layer in range(num_layers):
        if progress is not None:
            progress(f"encoder.layer.{layer}", layer, num_layers)
        x = graph.layer(x, mask, f"encoder.layer.{layer}", num_heads, hidden // num_heads, eps)
    pooled = graph.pool(x, model.pooling)
    graph.output(graph.normalize(pooled) if model.normalize else pooled, hidden)
    onnx_model = graph.build(model)
    onnx.checker.check_model(onnx_model)
    onnx.save(onnx_model, str(path))
    if progress is not None:
        progress("done", num_layers, num_layers)
