"""The state a server keeps and the rules it keeps it by, beside ``core/`` (the science) and ``mcp/`` (the protocol).

- ``folders``: where each principal's output and the caches live;
- ``paths``: which client-named paths may be read (the allowed roots);
- ``limits``: the sizes a call may ask for (prompts, tokens, draws), one table settable by flag or environment;
- ``store``: stored results, figures and artifacts behind ``kind://id`` handles, written atomically;
- ``ledger``: every call a principal made, the record an export reruns;
- ``turns``: whose turn it is on the one model when several principals share it.

No model and no MCP here: ``core/`` reads ``limits``, ``folders`` and ``paths``; the host and adapters hold the rest.
"""
