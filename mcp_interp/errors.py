"""Errors whose text is written for the caller (usually an LLM): what was wrong, how to fix it.

The adapters' one error boundary (``mcp/toolkit.py:error_boundary``) turns these into tool errors
(``isError``) with the message verbatim. Any other exception is a bug in mcp-interp: the caller gets a
short tool error naming its type, and the traceback is logged to stderr.
"""

from __future__ import annotations

from typing import Any, get_args


class InterpError(Exception):
    """Base class: the message is shown to the caller as-is."""


class InputError(InterpError, ValueError):
    """The request cannot be run as given (multi-token answer, unequal pair lengths, ...)."""


class ModelLoadError(InterpError, RuntimeError):
    """The model could not be loaded; the message names the fix."""


class NumericalError(InterpError, ArithmeticError):
    """The model produced non-finite numbers (NaN or ±inf) where a measurement needs finite ones."""


class Unsupported(InputError):
    """A measurement needs a feature the running backend does not have; the message names the backend, the feature and
    the fix (built by ``Backend.refuse``)."""

    def __init__(self, message: str, backend: str, feature: str) -> None:
        super().__init__(message)
        self.backend, self.feature = backend, feature


class NotFound(LookupError):
    """A stored id is malformed, was evicted, or names nothing stored; the message is safe to show the client."""


class ToolCallError(RuntimeError):
    """A tool refused or failed when called through the Python API; the message is the tool's error text (what was
    wrong and how to fix it)."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(message)
        self.tool = tool


class FingerprintMismatch(RuntimeError):
    """An exported investigation was rerun on weights other than the ones it recorded."""


class SetupError(Exception):
    """``mcp-interp setup`` could not finish; the message says why and what to do."""


class CompileError(ValueError):
    """``mcp-interp compile-rasp``: a program file tracr cannot compile; the message names the file, the node and the
    fix."""


class HttpConfigError(ValueError):
    """The HTTP options are unsafe or inconsistent; the message says how to fix them."""


class Interrupted(BaseException):
    """Raised inside a forward (at the next transformer block) once the caller of the model work in flight was
    cancelled, so a cancelled call or job frees the model within one block instead of at the end of its step. A
    ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` on the way may swallow it."""


class StopForward(Exception):
    """Not an error: raised by a hook once everything a caller needs has been computed, so the rest of the forward is
    skipped (caught by the backend that raised it)."""


def require_choice(argument: str, value: object, vocabulary: Any, hint: str = "") -> None:
    """Refuse ``value`` unless it is one of the values of the ``Literal`` type ``vocabulary`` (``schemas.common``): an
    ``InputError`` listing them (a tool's arguments are checked on arrival; this guards calls from Python)."""
    allowed = [repr(choice) for choice in get_args(vocabulary)]
    if value not in get_args(vocabulary):
        choices = allowed[0] if len(allowed) == 1 else f"{', '.join(allowed[:-1])} or {allowed[-1]}"
        raise InputError(f"`{argument}` must be {choices}, got {value!r}.{hint}")
