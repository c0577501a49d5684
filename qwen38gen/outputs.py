"""Every file the tool writes goes through here (STYLE.md principle 19: a path the user gives is
never destroyed).

- A target is a new path or an existing regular file, which is replaced atomically: the text goes
  to a temp file in the target's folder, renamed over it once complete. An existing character
  device or FIFO (``/dev/null``, ``/dev/stdout``, a named pipe) is written in place, never
  replaced; a folder, a socket or a block device is refused, as is a path under a file.
- ``check_outputs`` compares resolved paths (symlinks followed, hard links by inode): an output
  that is one of the command's inputs, lies as an existing file inside an input folder, or is
  another of its outputs is refused before any work starts.
- Files get mode 0o666 less the umask, as open() would give them (mkstemp alone gives 0600).
- Temp files are removed on every way out: an error, an exception, and a signal (``interrupt``
  raises it in the main thread, where the ``except BaseException`` here runs).
- ``written()`` lists what was completed, for the line that reports an interruption.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterable

from .errors import UserError
from .interrupt import critical

_written: list[str] = []


def umask() -> int:
    """The process's umask: Linux shows it in /proc/self/status; elsewhere it is set and put
    back (no call only reads it), which a thread creating a file at that instant could see."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def written() -> list[str]:
    """The outputs completed so far by this process (oldest first)."""
    return list(_written)


def forget_written() -> None:
    _written.clear()


def note_written(path) -> None:
    _written.append(str(path))


def resolved(path) -> Path:
    """The absolute path with every symlink followed (the target need not exist)."""
    return Path(os.path.realpath(os.path.abspath(os.fspath(path))))


def same_path(a, b) -> bool:
    """Whether two paths name the same file: resolved paths equal, or the same inode."""
    if resolved(a) == resolved(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def inside(path, folder) -> bool:
    """Whether ``path`` lies strictly inside ``folder`` (both resolved)."""
    p, f = resolved(path), resolved(folder)
    return f in p.parents


def check_folder_pair(src, out) -> None:
    """Refuse an output folder that is the source folder, lies inside it or contains it (paths
    resolved, symlinks followed): replacing it would delete the source."""
    rs, ro = resolved(src), resolved(out)
    if rs == ro or same_path(src, out):
        raise UserError(f"output folder {str(out)!r} is the source folder {str(src)!r}; "
                        "choose another folder")
    if rs in ro.parents:
        raise UserError(f"output folder {str(out)!r} lies inside the source folder "
                        f"{str(src)!r}; choose a folder outside it")
    if ro in rs.parents:
        raise UserError(f"output folder {str(out)!r} contains the source folder {str(src)!r}; "
                        "replacing it would delete the source: choose another folder")


_KINDS = ((stat.S_ISDIR, "a folder; give a file name"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISBLK, "a block device"))


def check_target(path) -> bool:
    """Refuse a target that can only be destroyed or cannot be written; True where it is written
    in place (a character device or FIFO), False where a temp file is renamed over it."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None
    except OSError as e:
        raise UserError(f"cannot write {str(p)!r}: {e.strerror or e}") from None
    if st is not None:
        for test, kind in _KINDS:
            if test(st.st_mode):
                raise UserError(f"cannot write {str(p)!r}: it is {kind}")
        return stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)
    for q in resolved(p).parents:
        if q.exists():
            if not q.is_dir():
                raise UserError(f"cannot write {str(p)!r}: {str(q)!r} is a file, not a folder")
            break
    return False


def check_outputs(outputs: dict[str, object], inputs: dict[str, object] | None = None) -> None:
    """Check every target of a command before it starts: ``outputs`` and ``inputs`` map an
    option's name (e.g. "--json") to its path or None. An output may not be an input, an
    existing file inside an input folder, or another output (a character device such as
    /dev/null excepted: writing it twice destroys nothing)."""
    outs = [(k, Path(v)) for k, v in outputs.items() if v is not None]
    ins = [(k, Path(v)) for k, v in (inputs or {}).items() if v is not None]
    for name, p in outs:
        in_place = check_target(p)
        for iname, i in ins:
            if same_path(p, i) or (i.is_dir() and p.exists() and inside(p, i)):
                raise UserError(f"{name} {str(p)!r} is {'' if same_path(p, i) else 'inside '}"
                                f"the input {iname} {str(i)!r}; writing it would destroy the "
                                "input: choose another path")
        for oname, o in outs:
            if oname == name:
                break
            if same_path(p, o) and not (in_place and stat.S_ISCHR(os.stat(p).st_mode)):
                raise UserError(f"{name} {str(p)!r} is also {oname}; give each output its own "
                                "path")


class Target:
    """One output file, opened before the work and committed at its end. ``open()`` makes the temp
    file beside the target (so an unwritable folder is found at once), or opens a character
    device or FIFO in place; ``commit()`` renames the temp over the target; ``discard()`` removes
    it. As a context manager: commit on success, discard on any exception or signal."""

    def __init__(self, path, binary: bool = False):
        self.path = Path(path)
        self.binary = binary
        self.in_place = check_target(self.path)
        self.tmp: str | None = None
        self.f: IO | None = None

    def open(self) -> IO:
        mode = "wb" if self.binary else "w"
        try:
            if self.in_place:
                self.f = open(self.path, mode)
                return self.f
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                            suffix=".tmp")
            self.f = os.fdopen(fd, mode)
            os.fchmod(fd, 0o666 & ~umask())
        except OSError as e:
            self.discard()
            raise UserError(f"cannot write {str(self.path)!r}: {e.strerror or e}") from None
        return self.f

    def write(self, data) -> None:
        """Write to the open target; a full disk or an I/O error is a UserError naming it."""
        try:
            (self.f or self.open()).write(data)
        except OSError as e:
            self.discard()
            raise UserError(f"cannot write {str(self.path)!r}: {e.strerror or e}") from None

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            self.discard()
            raise UserError(f"cannot write {str(self.path)!r}: {e.strerror or e}") from None

    def _close(self) -> None:
        f, self.f = self.f, None
        if f is not None:
            f.close()

    def commit(self) -> None:
        """Close, then rename the temp over the target (the target is complete or untouched)."""
        try:
            self._close()
            if self.tmp is not None:
                os.replace(self.tmp, self.path)
                self.tmp = None
        except OSError as e:
            self.discard()
            raise UserError(f"cannot write {str(self.path)!r}: {e.strerror or e}") from None
        note_written(self.path)

    def discard(self) -> None:
        """Close and remove the temp file (safe to call twice, and after a failed open)."""
        with contextlib.suppress(OSError):
            self._close()
        tmp, self.tmp = self.tmp, None
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def __enter__(self) -> IO:
        return self.open()

    def __exit__(self, et, ev, tb):
        if et is None:
            self.commit()
        else:
            self.discard()
        return False


def write_files(files: dict, inputs: dict[str, object] | None = None,
                names: Iterable[str] | None = None) -> None:
    """Write each text to its path, all or none: every temp file is written first, then all are
    renamed with signals deferred, the first path last (the main file, e.g. a .cu, appears only
    once the files that go with it are in place). ``names`` labels the paths in messages."""
    paths = [Path(p) for p in files]
    labels = list(names) if names is not None else [f"output {i + 1}" for i in range(len(paths))]
    check_outputs(dict(zip(labels, paths)), inputs)
    targets = [Target(p) for p in paths]
    try:
        for t, text in zip(targets, files.values()):
            t.write(text)
            t.flush()
        with critical():
            for t in reversed(targets):
                t.commit()
    finally:
        for t in targets:
            t.discard()


def write_text(path, text: str, inputs: dict[str, object] | None = None,
               name: str = "output") -> None:
    """Write one file (write_files)."""
    write_files({path: text}, inputs, [name])
