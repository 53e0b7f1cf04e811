"""Sparse dictionaries: SAEs (``sae``, read from SAELens' format by ``saelens``) and transcoders (``transcoders``, read
from circuit-tracer's format by ``transcoder_format``)."""
