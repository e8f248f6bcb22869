"""Anthropic's Messages bodies without HTTP: the request models and their
conversion into a serving chat request (`request`), and the answers as
Anthropic's JSON (`answer`). `api/anthropic/` routes and streams them."""
