"""Known answers: RASP programs compiled by tracr (``compile``), whose circuits are known by construction
(``circuit``) — the ground truth interpretability methods are scored against (``scripts/bench_known_answer.py``).

Needs the ``tracr`` extra (``pip install 'mcp-interp[tracr]'``: tracr-pypi, with jax and dm-haiku); serving a compiled
folder does not (``core.engine.backend.loader.program``).
"""
