"""A real full disk for tests: a small tmpfs mounted on a folder, filled to the last byte.

CI runs as root, where ``mount -t tmpfs`` is permitted; elsewhere the tests that need it skip and
say why (``tests/test_atomic.py`` also checks the writer against ``RLIMIT_FSIZE``, which needs no
privilege).
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def full_disk(folder: Path, files: Mapping[str, bytes] | None = None, size: str = "256k",
              filled: bool = True) -> Iterator[Path]:
    """Mount a ``size`` tmpfs on ``folder``, write ``files`` into it, fill the rest (unless not
    ``filled``: the test fills it later with :func:`fill`); unmount after.

    Skips the test when this process may not mount (not root, no CAP_SYS_ADMIN).
    """
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs mount, not permitted here: {mounted.stderr.strip()}")
    try:
        for name, data in (files or {}).items():
            (folder / name).write_bytes(data)
        if filled:
            fill(folder / ".filler")
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(path: Path) -> None:
    """Write to ``path`` until the disk refuses a single byte (ENOSPC)."""
    with path.open("wb", buffering=0) as file:
        for chunk in (1 << 16, 4096, 1):
            try:
                while True:
                    file.write(b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
