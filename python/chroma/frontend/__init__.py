"""Chroma's frontend layer: PyTorch models to Chroma graph files (`exporter`, through
torch.export and the `decompositions` Chroma applies; `graph_file` writes and reads the
container, docs/graph_format.md). Imports only the base modules (and torch, when called)."""
