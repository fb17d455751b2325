"""Files the grader writes (CSV, reports, the class report) appear whole or not at all.

Each is written to a temporary file in the same folder and renamed over its final name only once
it is complete: a run that crashes, is killed or fails half-way leaves what was there before.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes(path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
        if isinstance(e, OSError) and e.filename is None:  # (a full disk: name the file it was for)
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    return path


def write_text(path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))
