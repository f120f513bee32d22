"""Chroma's cache layer: the fingerprint of a compile (`fingerprint`) and the model cache that
keeps finished artifacts under it (`model_cache`). Imports the runtime and the base modules."""
