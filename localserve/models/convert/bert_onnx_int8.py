"""The fused BERT graph with int8 projections whose activations are quantized
per token: each row of each projection's input gets its own scale and zero
point, so a text's vector never depends on the texts batched with it.

ONNX Runtime's own dynamic quantization (`quantize_dynamic`) takes one
activation scale per call: the largest value anywhere in the padded batch
sets every row's precision, and a text's vector shifts with its batchmates.
Here each projection `x @ W` becomes, per token row r of x:

    lo, hi = min(x_r, 0), max(x_r, 0);  s_r = (hi - lo) / 255;  z_r = round(-lo / s_r)
    q_r    = QuantizeLinear(x_r, s_r, z_r)                         (uint8, per-axis over the rows)
    y_r    = s_r * (MatMulIntegerToFloat(q_r, W8, 1, w_s) - z_r * colsum(W8 * w_s))

Integer products are exact, so a row's result is the same in any batch and
on any CPU. uint8 activations against int8 weights use MLAS's u8s8 kernels
(on a 2-core AVX-512 VNNI host: 1.6 ms against 3.5-4.0 ms for a 512x384x1536
float MatMul; int8 activations took 12.8 ms). Without VNNI those kernels add
pairs of u8*s8 products in saturating 16-bit lanes, so the weights keep 7
bits (|w8| <= 63: 2 * 255 * 63 < 32767) and no CPU saturates.

Measured against float32 on tests/models/test_bert_onnx_variants.py's texts
(cosine, min / mean): this form 0.9935 / 0.9976; symmetric per-token
activations with 8-bit weights 0.9909 / 0.9973, with 7-bit weights 0.983;
asymmetric with 8-bit weights 0.9963 / 0.9989 (saturates without VNNI);
ORT's per-call quantization of the feed-forward inputs alone 0.990.

The attention projection goes through the same path, then
MultiHeadAttention (which takes Q, K and V already projected) instead of the
fused Attention node.
"""

from __future__ import annotations

import numpy as np

from localserve.models.convert.bert_onnx_fused import FusedGraph

LEVELS = 255  # uint8 activations
WEIGHT_MAX = 63  # 7-bit weights: no u8s8 saturation on CPUs without VNNI


class RowInt8Graph(FusedGraph):
    """A `FusedGraph` whose four projections per layer are int8 with per-token activation scales."""

    def embeddings(self, eps: float) -> tuple[str, str]:
        x, mask_index = super().embeddings(eps)
        self.const("q_zero", np.array(0, np.float32))
        self.const("q_one", np.array(1.0, np.float32))
        self.const("q_inv_levels", np.array(1 / LEVELS, np.float32))
        self.const("q_tiny", np.array(1e-12, np.float32))
        self.const("q_zero_u8", np.array(0, np.uint8))
        self.const("q_flat_rows", np.array([-1], np.int64))
        return x, mask_index

    def qmatmul(self, x: str, weight: np.ndarray, name: str) -> str:
        """`x @ weight` ([B, T, K] @ [K, N], float32 out, no bias) in int8."""
        from onnx import TensorProto

        w = weight.astype(np.float32)
        w_scale = np.maximum(np.abs(w).max(axis=0) / WEIGHT_MAX, 1e-12).astype(np.float32)
        w_q = np.clip(np.round(w / w_scale), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8)
        colsum = (w_q.astype(np.float32).sum(axis=0) * w_scale).astype(np.float32)
        hi = self.op("Max", [self.op("ReduceMax", [x], axes=[-1], keepdims=1), "q_zero"])  # [B, T, 1]
        lo = self.op("Min", [self.op("ReduceMin", [x], axes=[-1], keepdims=1), "q_zero"])
        scale = self.op("Add", [self.op("Mul", [self.op("Sub", [hi, lo]), "q_inv_levels"]), "q_tiny"])
        zero_point = self.op("Round", [self.op("Div", [self.op("Neg", [lo]), scale])])
        rows = self.op("Reshape", [x, self.const(self._name("q_rows_by"), np.array([-1, w.shape[0]], np.int64))])
        q = self.op(
            "QuantizeLinear",
            [
                rows,
                self.op("Reshape", [scale, "q_flat_rows"]),
                self.op("Cast", [self.op("Reshape", [zero_point, "q_flat_rows"])], to=TensorProto.UINT8),
            ],
            axis=0,
        )
        (y,) = self.ms(
            "MatMulIntegerToFloat",
            [
                self.op("Reshape", [q, self.op("Shape", [x])]),
                self.const(f"{name}.int8", w_q),
                "q_one",
                self.const(f"{name}.scale", w_scale),
                "q_zero_u8",
            ],
        )
        y = self.op("Sub", [y, self.op("Mul", [zero_point, self.const(f"{name}.colsum", colsum)])])
        return self.op("Mul", [y, scale])

    def attention(self, x: str, mask_index: str, a: str, num_heads: int, head_dim: int) -> str:
        """Q, K and V projected in int8, then MultiHeadAttention (the fused
        Attention node takes float weights and projects them itself)."""
        weight, bias = self.qkv(a)
        qkv = self.qmatmul(x, weight, f"{a}.qkv")
        sizes = self.const(self._name("qkv_split"), np.array([num_heads * head_dim] * 3, np.int64))
        q, k, v = (self._name("split") for _ in range(3))
        self.nodes.append(self.h.make_node("Split", [qkv, sizes], [q, k, v], name=q, axis=-1))
        (context,) = self.ms(
            "MultiHeadAttention", [q, k, v, self.const(f"{a}.qkv.bias", bias), mask_index], num_heads=num_heads
        )
        return context

    def project(self, x: str, dense: str) -> str:
        return self.qmatmul(x, self.w[f"{dense}.weight"].T, dense)
