"""Pipelines built on compiled components (api layer). TextToImage: Chroma1-HD's
text-to-image pipeline (docs/text_to_image.md)."""

from .text_to_image import OFFICIAL_NEGATIVE, Result, TextToImage

__all__ = ["TextToImage", "Result", "OFFICIAL_NEGATIVE"]
