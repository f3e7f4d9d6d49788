"""Every file tuner writes is written whole or not at all.

``Path.write_text`` truncates the file before it writes: on a full disk, a rerun of a launch left
a 0-byte ``best_config.yaml`` where the previous good answer had been. Here the bytes go to a
temporary file in the same folder (so the rename cannot cross file systems), are flushed to the
disk (``fsync``), and the temporary file is renamed over the target with ``os.replace``, which
POSIX makes atomic: a reader sees the old file or the new one, never a part. If anything fails
(``ENOSPC``, ``EDQUOT``, ``EFBIG``, ``EIO``, permissions), the target is left exactly as it was,
the temporary file is removed, and :class:`~tuner.errors.OutputError` says which file and why.

The temporary file is ``.<name>.<random>.tmp`` beside the target; a file that exists keeps its
permission bits, a new one gets ``mode`` less the umask, as ``open`` would give it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

from tuner.errors import OutputError

_FULL = (errno.ENOSPC, errno.EDQUOT)


def write_text(path: str | Path, text: str, mode: int = 0o666) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; return the path written.

    Raises:
        OutputError: it could not be written; the earlier file is unchanged.
    """
    return write_bytes(path, text.encode("utf-8"), mode)


def write_bytes(path: str | Path, data: bytes, mode: int = 0o666) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docs); return the path written.

    Raises:
        OutputError: it could not be written; the earlier file is unchanged.
    """
    target = Path(path)
    if target.is_symlink():  # write where the link points, as write_text did, and keep the link
        target = target.resolve()
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        _write_synced(temp, data, mode, _mode_of(target))
        os.replace(temp, target)
        _sync_folder(target.parent)
    except OSError as exc:
        _remove(temp)
        raise OutputError(describe(exc, target)) from exc
    return target


def describe(exc: OSError, path: Path) -> str:
    """``cannot write PATH: REASON``, saying plainly when the disk (or the quota) is full, and that
    the earlier file, if there is one, is unchanged."""
    path = path.absolute()
    reason = (f"the disk holding {path.parent} is full ({exc.strerror})" if exc.errno in _FULL
              else str(exc.strerror or exc))
    kept = "; the earlier file is unchanged" if path.exists() else ""
    return f"cannot write {path}: {reason}{kept}"


def _write_synced(temp: Path, data: bytes, mode: int, keep: int | None) -> None:
    """Create ``temp`` (``mode`` less the umask, or exactly ``keep``), write ``data``, fsync."""
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        if keep is not None:
            os.fchmod(fd, keep)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _mode_of(target: Path) -> int | None:
    """The permission bits of the file being replaced; None if there is none."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return None


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable; a file system that cannot sync a folder is let be."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _remove(temp: Path) -> None:
    """Remove the temporary file if it was made (a folder gone or read-only leaves nothing to do)."""
    with contextlib.suppress(OSError):
        temp.unlink()
