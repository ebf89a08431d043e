"""online provider."""
