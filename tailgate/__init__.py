"""tailgate: an LLM serving engine that protects the decode tail."""

__version__ = "0.1.0"
