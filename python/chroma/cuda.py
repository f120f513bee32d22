"""The name this module had before the runtime layer (chroma.runtime.native): kept for code that
imports chroma.cuda; new code imports chroma.runtime."""

from .runtime.native import *  # noqa: F401,F403
from .runtime.native import _Host  # noqa: F401
