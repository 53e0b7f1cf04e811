"""Pydantic I/O of every tool, one module per tool family; they become the tools' ``outputSchema``.

``common`` holds what the families share. Nothing here imports from the rest of the project.
"""
