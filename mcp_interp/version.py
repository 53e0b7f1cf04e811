"""The package's version, in a leaf module: whatever states it (the CLI, the server's initialize, an exported graph's
metadata) imports it from here, never from the package root."""

__version__ = "0.1.0"
