"""Models on this machine: the Hugging Face cache, Ollama's and LM Studio's stores, and discovery over all of them in one pass."""
