"""vllm provider."""
