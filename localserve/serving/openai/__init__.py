"""OpenAI's bodies and answers without HTTP, in the shape of every dialect:
the request models (`schemas`) and their conversion into the serving layer's
requests (`request`, which the endpoints and batch lines import them from),
and the answers as OpenAI's JSON (`answer`: chat completion and completion
objects, whole and streamed; `responses`: the Responses API's object and
events). `chat`, `completions` and `responses` start an answer and wait for
it whole; `embeddings` and `rerank` hold the one-shot endpoints' bodies and
answers, `batches` the Batch API's body, `models` the model objects of
`/v1/models`.

`api/openai/` routes HTTP requests to these and streams the chunks;
`batch_lines` runs Batch API lines through the very same functions (for the
server's batches and for `localserve batch run`), so a line's body is byte
for byte what the endpoint answers.
"""
