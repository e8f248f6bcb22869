"""`localserve bench`: a load generator for any OpenAI-compatible server.

It talks HTTP only (aiohttp) and imports nothing of the engine, so it
measures localserve and its peers (llama.cpp's `llama-server`,
`llama_cpp.server`, ...) the same way: `workload` builds the requests,
`client` streams one and times it, `runner` drives closed-loop and open-loop
(Poisson) load, `report` turns the timings into percentiles and tables, and
`command` is the `localserve bench` subcommand.
"""
