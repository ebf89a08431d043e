"""Google APIs on the sandbox: the Gemini Developer API batch mode (and Vertex AI, in its own modules)."""
