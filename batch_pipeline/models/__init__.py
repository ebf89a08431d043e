"""Models built locally (no download): the tiny random-weight Llama used by the vLLM tests and demo."""
