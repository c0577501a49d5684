"""The manifest's wire format: its version and the check every reader makes before reading it.

Format 2 (this one): every kernel carries its "family" (and the fields its consumers need, such as
"tiles", the n-tiles of the tile order it writes its output in), every GEMV launch its "role",
"weight", "epi", "btg" and "tiles" (of the tile order it reads its input in, 0 for rows), and
"up" where gate_up runs SwiGLU in its epilogue; the tuning it was emitted with is in "tuning".
Consumers (runtime, emulator, bench, trace) read these fields, never the kernel's name.
"""

from __future__ import annotations

from .errors import UserError

MANIFEST_FORMAT = 2


def check_format(manifest: dict, where: str = "this manifest") -> None:
    """Refuse a manifest of another format, with the command that makes a current one."""
    got = manifest.get("format") if isinstance(manifest, dict) else None
    if got != MANIFEST_FORMAT:
        raise UserError(f"{where} has format {got!r}; this qwen38gen reads manifest format "
                        f"{MANIFEST_FORMAT}: re-emit the program (qwen38gen emit ...)")
