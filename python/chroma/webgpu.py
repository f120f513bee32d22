"""The name this module had before the runtime layer (chroma.runtime.webgpu): kept for code that
imports chroma.webgpu; new code imports chroma.runtime."""

from .errors import IndexOutOfRange, PackageError, RunError  # noqa: F401
from .runtime.package import ALIGN, FORMAT_VERSION, HEADER_SIZE, MAGIC, STATUS_BYTES, Tensor  # noqa: F401
from .runtime.webgpu import *  # noqa: F401,F403
from .runtime.webgpu import _load_triton_first  # noqa: F401
