"""Where the emitted source comes from and how it is marked: the kernels/ folder its headers are
inlined from, and the line that ends its header (what the gate's cache key and the digest test
read below). Both emit and gate import it; it imports neither.
"""

from __future__ import annotations

import os
from pathlib import Path

HEADER_END = "// ---- end of header ----"


def kernels_dir() -> Path:
    """The kernels/ folder: $QWEN38_KERNELS (read when called), else the checkout's."""
    return Path(os.environ.get("QWEN38_KERNELS") or Path(__file__).resolve().parent.parent / "kernels")
