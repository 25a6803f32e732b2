"""The package's version (a leaf: what reports it needs import nothing else)."""

__version__ = "0.1.0"
