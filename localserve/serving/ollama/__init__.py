"""Ollama's bodies without HTTP: the request models and their conversion into
serving requests (`request`), and the answers as Ollama's JSON (`answer`).
`api/ollama/` routes them and writes the NDJSON streams."""
