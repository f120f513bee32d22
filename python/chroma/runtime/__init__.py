"""Chroma's runtime layer: what loads and runs a compiled artifact, with NumPy only (never
torch). `package` reads and checks GPU packages; it imports only `chroma.errors` and
`chroma.golden`."""
