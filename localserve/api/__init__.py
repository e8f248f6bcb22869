"""The HTTP API: OpenAI-compatible routes on aiohttp (see `localserve.api.app`)."""
