"""The OpenVINO family: a decoder (static shapes for the NPU), embeddings and Whisper."""
