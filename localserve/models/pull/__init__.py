"""Pulling models from the Hugging Face Hub, with progress and errors that say what to do."""
