"""The ONNX Runtime family: a decoder with past key/values, and embeddings."""
