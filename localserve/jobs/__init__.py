"""The Files and Batch APIs' store, validation and runner, and offline batch runs."""
