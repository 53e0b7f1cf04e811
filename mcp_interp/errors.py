"""Errors whose text is written for the caller (usually an LLM): what was wrong, how to fix it.

The MCP adapters turn these into tool errors (``isError``) verbatim. Any other exception is a
bug in mcp-interp and is logged with its traceback.
"""


class InterpError(Exception):
    """Base class: the message is shown to the caller as-is."""


class InputError(InterpError, ValueError):
    """The request cannot be run as given (multi-token answer, unequal pair lengths, ...)."""


class ModelLoadError(InterpError, RuntimeError):
    """The model could not be loaded; the message names the fix."""
