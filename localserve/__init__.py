"""localserve: a local LLM and speech server."""

__version__ = "0.1.0"
