"""localserve: a local LLM and speech server."""

import os

# llama.cpp's OpenMP threads spin-wait between steps by default. In a server
# that shares its cores with an event loop and other models, spinning steals
# the CPU those need (measured: one-shot embeddings 3-10x slower under load).
# It must be set before llama_cpp loads libgomp, hence here; users can still
# override it in the environment.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
