"""OpenAI-compatible HTTP server: validation, chat templates, SSE, metrics. Never touches pages."""
