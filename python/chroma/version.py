"""Chroma's version (base layer: imports nothing)."""

__version__ = "0.1.0"
