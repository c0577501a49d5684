"""Does the tree here hold the files of the commit that `make device-prep` recorded?

The device machine gets the working tree without .git, so `make device-prep` writes the commit's
hash (.gpu/COMMIT) and its index (.gpu/FILES, `git ls-files -s`: mode, blob id, stage, path) on the
CPU machine; here every path's git blob id (sha1 of "blob <size>\\0" + content; a symbolic link's
blob is its target) is recomputed and compared.

  python3 scripts/tree_match.py .gpu/FILES     -> one line; exit 0 if every file matches, else 1
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path


def blob_id(path: Path) -> str | None:
    """The git blob id of a file or symbolic link, None if it is missing."""
    try:
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def compare(index: str, root: Path) -> tuple[int, list[str], list[str]]:
    """(files checked, changed paths, missing paths) of an index listing against root."""
    n, changed, missing = 0, [], []
    for line in index.splitlines():
        if not line.strip():
            continue
        meta, path = line.split("\t", 1)
        mode, blob, _stage = meta.split()
        if mode == "160000":   # a submodule: its files are not the commit's
            continue
        n += 1
        got = blob_id(root / path)
        if got is None:
            missing.append(path)
        elif got != blob:
            changed.append(path)
    return n, changed, missing


def _few(paths: list[str]) -> str:
    """' (a, b, c, …)' for up to five paths, '' for none."""
    if not paths:
        return ""
    return " (" + ", ".join(paths[:5]) + (", …" if len(paths) > 5 else "") + ")"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 scripts/tree_match.py .gpu/FILES", file=sys.stderr)
        return 2
    f = Path(argv[0])
    if not f.is_file():
        print(f"tree: not checked ({f} is missing: run `make device-prep` on the CPU machine)")
        return 1
    n, changed, missing = compare(f.read_text(), Path.cwd())
    if not changed and not missing:
        print(f"tree: matches the commit ({n} tracked files, every blob equal)")
        return 0
    print(f"tree: DIFFERS from the commit: {len(changed)} of {n} tracked files changed"
          f"{_few(changed)}, {len(missing)} missing{_few(missing)}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
