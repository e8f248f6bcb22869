"""The llama.cpp family: generation, sampling, tokenizer and embeddings, on llama-cpp-python."""
