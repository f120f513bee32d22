"""The name this module had before the runtime layer (chroma.runtime.emulator): kept for code
that imports chroma.simt; new code imports chroma.runtime."""

from .errors import PackageError, RunError  # noqa: F401
from .runtime.emulator import *  # noqa: F401,F403
