"""The BERT encoder as ONNX Runtime's fused contrib operators (domain
`com.microsoft`), written directly instead of left for an optimizer to find.

The plain graph of `bert_onnx` spells attention, GELU and the residual
LayerNorms out of standard operators; ONNX Runtime's transformer optimizer
does not recognise that spelling, so each layer ran as ~30 small kernels.
Here every layer is five nodes, the same ones `onnxruntime.transformers.
optimizer.optimize_model(model_type="bert")` leaves after fusing an optimum
export:

    EmbedLayerNormalization (once) -> per layer: Attention -> MatMul ->
    SkipLayerNormalization -> MatMul -> BiasGelu -> MatMul -> SkipLayerNormalization

The arithmetic is the plain graph's (exact erf GELU, -1e4 on padding keys),
so embeddings agree to float rounding. Only ONNX Runtime runs these
operators; OpenVINO converts the plain graph. Batches stay padded
rectangles: the padding-free forms (PackedAttention, PackedMultiHeadAttention)
have CUDA kernels only; onnxruntime 1.32's CPU provider refuses them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from localserve.models.convert.bert_onnx_graph import Graph

MS_DOMAIN = "com.microsoft"


class FusedGraph(Graph):
    """A `Graph` whose embeddings and layers are ONNX Runtime contrib operators."""

    opset_domains = (("", 17), (MS_DOMAIN, 1))

    def ms(self, kind: str, inputs: list[str], num_outputs: int = 1, **attrs: Any) -> list[str]:
        outputs = [self._name(kind.lower()) for _ in range(num_outputs)]
        self.nodes.append(self.h.make_node(kind, inputs, outputs, name=outputs[0], domain=MS_DOMAIN, **attrs))
        return outputs

    def embeddings(self, eps: float) -> tuple[str, str]:
        """Word + position + token-type embeddings, normalised, in one node;
        and each row's length (`mask_index`, the mask summed: right padding).
        Without `token_type_ids` type 0 is folded into the position table
        (both are constants)."""
        from onnx import TensorProto

        w = self.w
        positions = w["embeddings.position_embeddings.weight"]
        segments, segment_table = "", ""
        if self.token_types:
            segments = self.op("Cast", ["token_type_ids"], to=TensorProto.INT32)
            segment_table = self.weight("embeddings.token_type_embeddings.weight")
        else:
            positions = positions + w["embeddings.token_type_embeddings.weight"][0]
        ids = self.op("Cast", ["input_ids"], to=TensorProto.INT32)
        mask = self.op("Cast", ["attention_mask"], to=TensorProto.INT32)
        x, mask_index = self.ms(
            "EmbedLayerNormalization",
            [
                ids,
                segments,
                self.weight("embeddings.word_embeddings.weight"),
                self.const("positions" if self.token_types else "position_plus_type0", positions.astype(np.float32)),
                segment_table,
                self.weight("embeddings.LayerNorm.weight"),
                self.weight("embeddings.LayerNorm.bias"),
                mask,
            ],
            num_outputs=2,
            epsilon=eps,
        )
        self.mask = self.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)  # for mean pooling
        self.const("one", np.array([1]))  # pooling's axis, made by the plain embeddings
        return x, mask_index

    def layer(self, x: str, mask_index: str, p: str, num_heads: int, head_dim: int, eps: float) -> str:
        context = self.attention(x, mask_index, f"{p}.attention.self", num_heads, head_dim)
        x = self.skip_norm(context, x, f"{p}.attention.output.dense", f"{p}.attention.output.LayerNorm", eps)
        (gelu,) = self.ms(
            "BiasGelu",
            [self.project(x, f"{p}.intermediate.dense"), self.weight(f"{p}.intermediate.dense.bias")],
        )
        return self.skip_norm(gelu, x, f"{p}.output.dense", f"{p}.output.LayerNorm", eps)

    def qkv(self, a: str) -> tuple[np.ndarray, np.ndarray]:
        """The query, key and value projections of attention block `a` as one
        [hidden, 3 * hidden] weight and its bias."""
        weight = np.concatenate([self.w[f"{a}.{n}.weight"].T for n in ("query", "key", "value")], axis=1)
        bias = np.concatenate([self.w[f"{a}.{n}.bias"] for n in ("query", "key", "value")])
        return weight.astype(np.float32), bias.astype(np.float32)

    def attention(self, x: str, mask_index: str, a: str, num_heads: int, head_dim: int) -> str:
        """Self-attention's context (before the output projection): one Attention node."""
        weight, bias = self.qkv(a)
        (context,) = self.ms(
            "Attention",
            [x, self.const(f"{a}.qkv.weight", weight), self.const(f"{a}.qkv.bias", bias), mask_index],
            num_heads=num_heads,
        )
        return context

    def project(self, x: str, dense: str) -> str:
        """`x @ W` of the dense layer `dense` (its bias goes into the next fused node)."""
        return self.op("MatMul", [x, self.weight(f"{dense}.weight", True)])

    def skip_norm(self, h: str, skip: str, dense: str, norm: str, eps: float) -> str:
        """LayerNorm(skip + h @ W + b): the dense layer's bias goes into the norm node."""
        (out,) = self.ms(
            "SkipLayerNormalization",
            [
                self.project(h, dense),
                skip,
                self.weight(f"{norm}.weight"),
                self.weight(f"{norm}.bias"),
                self.weight(f"{dense}.bias"),
            ],
            epsilon=eps,
        )
        return out
