"""The MCP adapter layer: ``server.py`` builds the server, ``toolkit.py`` and ``family.py`` are what every family
uses, and one module per tool family declares its tools (thin: the science is in ``core/``; no family's module imports
another's). ``sdk_internals.py`` is the one place that reaches into the MCP SDK's internals."""
