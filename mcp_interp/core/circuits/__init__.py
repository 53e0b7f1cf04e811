"""Circuits: edge attribution over the residual-stream graph (writers → readers)."""
