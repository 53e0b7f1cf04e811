"""The ``inspect_ai`` entry point (pyproject): importing it registers the package's tasks, so that after install
``inspect eval mcp_interp/known_answer`` finds them."""

from mcp_interp.app.evals.known_answer import known_answer

__all__ = ["known_answer"]
