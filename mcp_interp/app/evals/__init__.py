"""Inspect evals of an agent using this server (``inspect eval mcp_interp/known_answer``); they need inspect-ai and
tracr (the ``eval`` extra). ``_registry`` is the ``inspect_ai`` entry point's module."""
