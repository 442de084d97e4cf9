"""Replace an output file atomically, so that a failed run leaves the old file exactly as it was."""
from __future__ import annotations

import os
import stat
import tempfile
from typing import Callable

from dynlab.errors import DynlabError


def _new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def replace_file(path: str, write: Callable[[str], None], suffix: str = ".tmp") -> None:
    """Produce ``path`` by calling ``write(tmp)`` on a temporary file beside it, then renaming it into place.

    - A symlink is followed: its target is replaced and the link stays a link.
    - An existing special file (a device such as ``/dev/null``, a FIFO) is written
      directly: it cannot be replaced, and must not be.
    - The new file keeps the old file's permission bits, or gets ``0o666 & ~umask``.
    - On any failure the temporary file is removed and ``path`` is untouched.

    Raises :class:`DynlabError` naming ``path`` when its directory is missing or not
    writable, or when writing fails with an ``OSError``.
    """
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise DynlabError(f"{path}: {exc.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise DynlabError(f"{path} is a directory")
        try:
            write(target)
        except OSError as exc:
            raise DynlabError(f"{path}: {exc.strerror}") from None
        return
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise DynlabError(f"{path}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".dynlab-", suffix=suffix, dir=directory)
    except OSError as exc:
        raise DynlabError(f"{path}: cannot write in {directory}: {exc.strerror}") from None
    os.close(fd)
    try:
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else _new_file_mode())
        write(tmp)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise DynlabError(f"{path}: {exc.strerror or exc}") from None
        raise
