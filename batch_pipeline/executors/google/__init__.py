"""Google backends: the Gemini Developer API batch mode (and Vertex AI batch prediction), one request format."""
