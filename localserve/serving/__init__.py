"""The serving layer: a request (chat, completion, text prompt, infill,
embeddings, transcription) in, engine work and an answer out, with no HTTP
in sight.

    types        the requests, deltas and results every caller shares
    models       how a call reaches its models (`ModelHost`, `LocalModels`)
    chat         conversations through the chat template, tools, JSON formats
    completions  plain prompts, fill-in-the-middle, Ollama-style text prompts
    embeddings   vectors through the model's one-shot queue
    transcription  audio to a `Transcript` through the model's one-shot queue
    answer       an answer in flight: typed deltas (streaming) or whole results
    prompts, tools, tools_parse, sampling, fim, generation: the parts
    validation   checks every body gets (Unicode text, pydantic's errors as a 400)
    openai/      OpenAI's request models and whole answers; Batch API lines

Every HTTP dialect in `localserve.api` is a thin adapter over these calls;
the batch runner, `localserve batch run`, Ray replicas and `localserve run`
call them directly (batch lines through `openai.batch_lines`).
"""
