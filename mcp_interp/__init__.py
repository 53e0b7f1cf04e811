"""mcp-interp: a Model Context Protocol server for mechanistic-interpretability experiments."""

__version__ = "0.1.0"
