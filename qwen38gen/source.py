"""Where the emitted source comes from and how it is marked: the kernels/ folder its headers are
inlined from, and the line that ends its header (what the gate's cache key and the digest test
read below). Both emit and gate import it; it imports neither.
"""

from __future__ import annotations

from .resources import kernels_dir

__all__ = ["HEADER_END", "kernels_dir"]

HEADER_END = "// ---- end of header ----"

