"""The plain ONNX graph of a BERT encoder (sentence-transformers weights),
one block per method; bert_onnx_fused.py writes the same arithmetic with
ONNX Runtime's fused operators, and bert_onnx.py picks and writes one."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from localserve.models.convert.cache import SentenceTransformersModel

OPSET = 17  # LayerNormalization


class Graph:
    """Collects nodes and initializers; each method adds one block."""

    opset_domains: tuple[tuple[str, int], ...] = (("", OPSET),)

    def __init__(self, weights: dict[str, np.ndarray], *, token_types: bool = False) -> None:
        from onnx import helper

        self.h = helper
        self.w = weights
        # With token_types the graph takes `token_type_ids` (a cross-encoder's
        # two segments); without, every token is of type 0.
        self.token_types = token_types
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.outputs: list[Any] = []
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], **attrs: Any) -> str:
        out = self._name(kind.lower())
        self.nodes.append(self.h.make_node(kind, inputs, [out], name=out, **attrs))
        return out

    def weight(self, name: str, transpose: bool = False) -> str:
        value = self.w[name].astype(np.float32)
        return self.const(name, value.T if transpose else value)

    def linear(self, x: str, prefix: str) -> str:
        return self.op(
            "Add", [self.op("MatMul", [x, self.weight(f"{prefix}.weight", True)]), self.weight(f"{prefix}.bias")]
        )

    def norm(self, x: str, prefix: str, eps: float) -> str:
        return self.op(
            "LayerNormalization",
            [x, self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias")],
            axis=-1,
            epsilon=eps,
        )

    def embeddings(self, eps: float) -> tuple[str, str]:
        """Word + position + token-type embeddings (type 0 unless the graph
        takes `token_type_ids`), normalised; and the additive attention bias
        (0 for tokens, -1e4 for padding)."""
        words = self.op("Gather", [self.weight("embeddings.word_embeddings.weight"), "input_ids"])
        num_tokens = self.op(
            "Slice", ["input_shape_of", self.const("one", np.array([1])), self.const("two", np.array([2]))]
        )
        self.nodes.insert(0, self.h.make_node("Shape", ["input_ids"], ["input_shape_of"]))
        positions = self.op(
            "Slice",
            [self.weight("embeddings.position_embeddings.weight"), self.const("zero", np.array([0])), num_tokens],
        )
        if self.token_types:
            token_type = self.op("Gather", [self.weight("embeddings.token_type_embeddings.weight"), "token_type_ids"])
        else:
            token_type = self.const(
                "token_type_0", self.w["embeddings.token_type_embeddings.weight"][0].astype(np.float32)
            )
        x = self.op("Add", [self.op("Add", [words, positions]), token_type])
        x = self.norm(x, "embeddings.LayerNorm", eps)
        mask = self.op("Cast", ["attention_mask"], to=1)  # float
        inverted = self.op("Sub", [self.const("f_one", np.array(1.0, np.float32)), mask])
        bias = self.op("Mul", [inverted, self.const("neg_big", np.array(-1e4, np.float32))])
        bias = self.op("Unsqueeze", [bias, self.const("axes_1_2", np.array([1, 2]))])  # [B, 1, 1, T]
        self.mask = mask
        return x, bias

    def layer(self, x: str, bias: str, p: str, num_heads: int, head_dim: int, eps: float) -> str:
        split = self.const(self._name("heads"), np.array([0, 0, num_heads, head_dim]))
        merge = self.const(self._name("merge"), np.array([0, 0, num_heads * head_dim]))

        def heads(name: str, perm: list[int]) -> str:
            return self.op(
                "Transpose", [self.op("Reshape", [self.linear(x, f"{p}.attention.self.{name}"), split])], perm=perm
            )

        q, k, v = heads("query", [0, 2, 1, 3]), heads("key", [0, 2, 3, 1]), heads("value", [0, 2, 1, 3])
        scale = self.const(self._name("scale"), np.array(1.0 / math.sqrt(head_dim), np.float32))
        scores = self.op("Add", [self.op("Mul", [self.op("MatMul", [q, k]), scale]), bias])
        context = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])
        context = self.op("Reshape", [self.op("Transpose", [context], perm=[0, 2, 1, 3]), merge])
        x = self.norm(
            self.op("Add", [x, self.linear(context, f"{p}.attention.output.dense")]),
            f"{p}.attention.output.LayerNorm",
            eps,
        )
        h = self.linear(x, f"{p}.intermediate.dense")
        erf = self.op(
            "Erf", [self.op("Mul", [h, self.const(self._name("rsqrt2"), np.array(1 / math.sqrt(2), np.float32))])]
        )
        gelu = self.op(
            "Mul",
            [
                self.op("Mul", [h, self.op("Add", [erf, "f_one"])]),
                self.const(self._name("half"), np.array(0.5, np.float32)),
            ],
        )
        return self.norm(self.op("Add", [x, self.linear(gelu, f"{p}.output.dense")]), f"{p}.output.LayerNorm", eps)

    def pool(self, x: str, pooling: str) -> str:
        if pooling == "cls":
            return self.op("Squeeze", [self.op("Gather", [x, self.const("cls_index", np.array([0]))], axis=1), "one"])
        mask = self.op("Unsqueeze", [self.mask, self.const("axes_2", np.array([2]))])  # [B, T, 1]
        summed = self.op("ReduceSum", [self.op("Mul", [x, mask]), "one"], keepdims=0)
        count = self.op("ReduceSum", [mask, "one"], keepdims=0)
        count = self.op("Max", [count, self.const("tiny", np.array(1e-9, np.float32))])
        return self.op("Div", [summed, count])

    def classify(self, x: str, num_labels: int) -> None:
        """A sequence classifier's head, as `BertForSequenceClassification`:
        the [CLS] row through the pooler (dense + tanh), then the classifier
        layer; output `logits` [batch, num_labels]."""
        from onnx import TensorProto

        pooled = self.op("Tanh", [self.linear(self.pool(x, "cls"), "pooler.dense")])
        self.nodes.append(self.h.make_node("Identity", [self.linear(pooled, "classifier")], ["logits"]))
        self.outputs.append(self.h.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", num_labels]))

    def normalize(self, x: str) -> str:
        length = self.op("ReduceL2", [x], axes=[-1], keepdims=1)  # axes an attribute until opset 18
        return self.op("Div", [x, self.op("Max", [length, self.const("eps_norm", np.array(1e-12, np.float32))])])

    def output(self, x: str, hidden: int) -> None:
        from onnx import TensorProto

        self.nodes.append(self.h.make_node("Identity", [x], ["embeddings"]))
        self.outputs.append(self.h.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", hidden]))

    def build(self, properties: dict[str, str]) -> Any:
        """The ONNX model, with `properties` as its metadata (`localserve.kind`, ...)."""
        from onnx import TensorProto

        names = (
            ("input_ids", "attention_mask", "token_type_ids") if self.token_types else ("input_ids", "attention_mask")
        )
        inputs = [self.h.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"]) for name in names]
        graph = self.h.make_graph(self.nodes, "sentence_embeddings", inputs, self.outputs, self.inits)
        onnx_model = self.h.make_model(
            graph,
            opset_imports=[self.h.make_opsetid(domain, version) for domain, version in self.opset_domains],
            producer_name="localserve",
        )
        onnx_model.ir_version = 8
        self.h.set_model_props(onnx_model, properties)
        return onnx_model


def embeddings_properties(model: SentenceTransformersModel) -> dict[str, str]:
    """What an embeddings graph computes after BERT (its ONNX metadata)."""
    return {
        "localserve.kind": "embeddings",
        "localserve.pooling": model.pooling,
        "localserve.normalize": str(model.normalize),
    }
