"""OpenAI's request and answer bodies, without HTTP: the request models
(`schemas`, `responses_request`, `embeddings`, `batches`), their conversion into the
serving layer's requests (`convert`), and the whole answers of chat
completions, completions, responses and embeddings (`chat`, `completions`,
`responses`, `embeddings`, built by `wire`), and the model objects of
`/v1/models` (`models`).

`api/openai/` routes HTTP requests to these and streams the chunks;
`batch_lines` runs Batch API lines through the very same functions (for the
server's batches and for `localserve batch run`), so a line's body is byte
for byte what the endpoint answers.
"""
