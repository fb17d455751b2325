"""Files the grader writes (CSV, reports, the class report) appear whole or not at all.

Each is written to a temporary file in the same folder and renamed over its final name only once
it is complete: a run that crashes, is killed or fails half-way leaves what was there before.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


class WriteFailed(OSError):
    """A file the grader writes could not be written (a full disk, no permission): the command
    says which and stops (`cli`); an OSError of anything else is a fault, with its traceback."""

    @classmethod
    def of(cls, e: OSError, path) -> "WriteFailed":
        return cls(e.errno, e.strerror or str(e), str(path))


def write_bytes(path, data: bytes) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise WriteFailed.of(e, path) from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and not isinstance(e, WriteFailed):  # (named: the file it was for)
            raise WriteFailed.of(e, path) from e
        raise
    return path


def write_text(path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))
