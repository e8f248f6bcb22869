"""OpenAI's dialect: chat, completions, embeddings, audio, Responses, Files and Batches."""
