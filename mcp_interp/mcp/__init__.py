"""The MCP adapter layer: ``server.py`` builds the server, ``toolkit.py`` is what every family uses, and one
module per tool family declares its tools (thin: the science is in ``core/``)."""
