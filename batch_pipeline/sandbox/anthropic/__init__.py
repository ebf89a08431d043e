"""anthropic provider."""
