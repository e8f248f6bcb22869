"""A BERT sequence classifier (`BertForSequenceClassification`: a
cross-encoder with one label, a text classifier with several) as an ONNX
graph or OpenVINO IR, built with the embeddings path's own graph builder
(`bert_onnx.write_encoder_graph`) and the classifier head as its hook: no torch.

The graph takes `input_ids`, `attention_mask` and `token_type_ids`
([batch, tokens], int64, right-padded; type 1 marks a pair's second text)
and returns `logits` [batch, num_labels]. Its labels (the folder's
`id2label`, in logit order) are in the model's metadata, and the tokenizer
is copied beside it as `<stem>.tokenizer.json`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localserve.errors import InvalidRequestError
from localserve.models.convert.bert_onnx import VARIANTS, Head, graph_class, tokenizer_path, write_encoder_graph
from localserve.models.convert.bert_onnx_graph import Graph
from localserve.models.convert.cache import (
    Progress,
    SentenceTransformersModel,
    store_target,
    write_atomically,
)

#: The weight-name prefix of the encoder inside a `BertFor...` checkpoint.
ENCODER_PREFIX = "bert."
LABELS_KEY = "localserve.labels"  # ONNX metadata: the labels as a JSON list
LABELS_RT_INFO = ("localserve", "labels")  # the same in an OpenVINO IR's rt_info
CLASSIFIER_ARCHITECTURE = "BertForSequenceClassification"


@dataclass(frozen=True, slots=True)
class ClassifierModel:
    """What the converter reads from a classifier folder."""

    path: Path
    config: dict[str, Any]
    labels: tuple[str, ...]

    @property
    def weights(self) -> Path:
        return self.path / "model.safetensors"

    def as_store_model(self) -> SentenceTransformersModel:
        """The store keys converted files by the source weights (`store_target`)."""
        return SentenceTransformersModel(self.path, self.config, "cls", False)


def classifier_config(path: Path) -> dict[str, Any] | None:
    """The folder's config.json if it is a BERT sequence classifier with its
    weights and tokenizer, else None."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        return None
    if CLASSIFIER_ARCHITECTURE not in (config.get("architectures") or ()):
        return None
    if not (path / "model.safetensors").is_file():
        return None
    return config


def labels_of(config: dict[str, Any]) -> tuple[str, ...]:
    """`id2label` in id order; `LABEL_i` names where it has none (as transformers does)."""
    id2label = config.get("id2label") or {}
    num_labels = int(config.get("num_labels") or len(id2label) or 2)
    return tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(num_labels))


def read_classifier(path: Path) -> ClassifierModel:
    config = classifier_config(path)
    if config is None:
        raise InvalidRequestError(
            f"{path} is not a BERT sequence classifier folder "
            f"(needs config.json naming {CLASSIFIER_ARCHITECTURE}, and model.safetensors)"
        )
    if not (path / "tokenizer.json").is_file():
        raise InvalidRequestError(f"{path} has no tokenizer.json (the fast tokenizer's file); save it with the model")
    return ClassifierModel(path, config, labels_of(config))


def classifier_head(model: ClassifierModel) -> Head:
    def head(graph: Graph, x: str, hidden: int) -> dict[str, str]:
        graph.classify(x, len(model.labels))
        return {"localserve.kind": "classifier", LABELS_KEY: json.dumps(list(model.labels))}

    return head


def encoder_weights(model: ClassifierModel) -> dict[str, Any]:
    """The checkpoint's weights, the encoder's named as `BertModel` names them."""
    from safetensors.numpy import load_file

    return {name.removeprefix(ENCODER_PREFIX): value for name, value in load_file(str(model.weights)).items()}


def cached_classifier_onnx(
    source: Path, name: str, *, variant: str = "fused", force: bool = False, progress: Progress | None = None
) -> Path:
    """The ONNX graph (`variant`: plain, fused or int8) of the classifier folder `source`."""
    model = read_classifier(source)
    target = store_target(model.as_store_model(), name, "classifier-" + VARIANTS[variant])
    if target.is_file() and tokenizer_path(target).is_file() and not force:
        return target
    write_atomically(tokenizer_path(target), lambda tmp: shutil.copyfile(model.path / "tokenizer.json", tmp))

    def write(tmp: Path) -> None:
        head = classifier_head(model)
        weights = encoder_weights(model)
        write_encoder_graph(model.config, weights, tmp, graph_class(variant), head, progress, token_types=True)

    return write_atomically(target, write)


def cached_classifier_gguf(source: Path, name: str, *, force: bool = False, progress: Progress | None = None) -> Path:
    """The GGUF (llama.cpp's `bert` with rank pooling) of the classifier folder `source`."""
    from localserve.models.convert.cache import convert_bert_to_gguf

    model = read_classifier(source)
    target = store_target(model.as_store_model(), name, "classifier-f32.gguf")
    if target.is_file() and not force:
        return target
    return convert_bert_to_gguf(model.as_store_model(), target, progress=progress, labels=model.labels)


def cached_classifier_openvino(source: Path, name: str, *, force: bool = False) -> Path:
    """The OpenVINO IR (.xml) of the classifier folder `source`: its plain
    ONNX graph through OpenVINO's ONNX frontend, weights kept in float32."""
    from localserve.models.convert.bert_openvino import save_ir

    model = read_classifier(source)
    target = store_target(model.as_store_model(), name, "classifier-f32-openvino.xml")
    if target.is_file() and target.with_suffix(".bin").is_file() and tokenizer_path(target).is_file() and not force:
        return target
    onnx_path = cached_classifier_onnx(source, name, variant="plain", force=force)
    save_ir(onnx_path, target, {LABELS_RT_INFO: json.dumps(list(model.labels))})
    return target
