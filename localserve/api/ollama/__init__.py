"""Ollama's API, for the editors and tools that speak it."""
