"""openai provider."""
