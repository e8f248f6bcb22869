"""Conversion once into the model store: embeddings to ONNX/OpenVINO, Whisper to whisper.cpp/OpenVINO, LLM export."""
