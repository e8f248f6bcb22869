"""llama-server's bodies without HTTP: the request models and their
conversion (`request`, with `bias` for `logit_bias`), and the answers as
llama-server's JSON (`answer`). `api/llamacpp/` routes them and streams the
events."""
