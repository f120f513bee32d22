"""Constants the compiled components and the NumPy side share (no torch)."""

# The key bias of a text token the image must not see: exp(score + KEY_MASKED - max) is
# exactly 0 in float32, and a row always keeps its image keys, so no row is fully masked.
KEY_MASKED = -1e30
