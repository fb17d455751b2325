"""The batch's journal: each student's result on disk as soon as they are graded.

CSV_PATH.journal holds one JSON line per graded student (appended and flushed to disk at once),
after a header line naming what the run grades (chapters, seed, devices). The CSV is rebuilt
from the results at the end of the run and the journal removed; a run that stops half-way
(killed, out of memory, the machine down) leaves it, and the next `batch` with the same --csv
and the same chapters, seed and devices resumes: the students in it whose notebooks have not
changed since (`fingerprint`) are not graded again.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..grading.results import SubmissionResult
from ..report.atomic import WriteFailed

FORMAT = "attention-autograder-journal/1"


def journal_path(csv_path) -> Path:
    """Where the batch writing `csv_path` keeps its journal: CSV_PATH.journal."""
    return Path(csv_path).with_name(Path(csv_path).name + ".journal")


def fingerprint(todo) -> str:
    """What a student handed in, as far as the journal can tell without reading it: each
    notebook's name, size and modification time (lstat only)."""
    h = hashlib.sha256()
    for chapter, notebook in todo:
        h.update(f"{chapter}\0{notebook}\0".encode("utf-8", "surrogateescape"))
        if notebook is not None:
            try:
                st = os.lstat(notebook)
                h.update(f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0".encode())
            except OSError:
                h.update(b"gone\0")
    return h.hexdigest()


def graded_students(path) -> int | None:
    """How many students a journal keeps a grade for: those a resumed run will not grade again
    while their notebooks stay as they are (a line cut short, an `error` entry and a student's
    second entry are not counted); None where there is no journal to read."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()[1:]
    except (OSError, ValueError):
        return None
    graded = set()
    for line in lines:
        try:
            entry = json.loads(line)
            if SubmissionResult.from_plain(entry["result"]).error is None:
                graded.add(entry["student"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return len(graded)


class Journal:
    def __init__(self, path, chapters, seed: int, devices):
        self.path = Path(path) if path else None
        self.header = {"format": FORMAT, "chapters": list(chapters or []), "seed": seed,
                       "devices": list(devices)}
        self._file = None

    def resume(self, prints: dict) -> dict:
        """student -> (SubmissionResult, identical flags) from an interrupted run of the same
        grading, for the students whose notebooks are unchanged (`prints`: student ->
        fingerprint). A journal of other grading, or unreadable, is set aside as .old."""
        if self.path is None or not self.path.is_file():
            return {}
        found = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
            if not lines or json.loads(lines[0]) != self.header:
                raise ValueError("other grading")
            for line in lines[1:]:
                try:
                    entry = json.loads(line)
                except ValueError:  # (a line cut short when the run stopped)
                    continue
                name = entry.get("student")
                if name in prints and entry.get("fingerprint") == prints[name]:
                    result = SubmissionResult.from_plain(entry["result"])
                    if result.error is None:  # (a grading that could not finish is done again)
                        found[name] = (result, entry.get("identical", []))
        except (OSError, ValueError, KeyError, TypeError):
            os.replace(self.path, self.path.with_name(self.path.name + ".old"))
            return {}
        self._open(append=True)
        return found

    def _open(self, append: bool) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if append:  # (a line cut short when the run stopped: the next one starts on a line of its own)
                with open(self.path, "rb+") as f:
                    data = f.read()
                    f.truncate(data.rfind(b"\n") + 1)
            self._file = open(self.path, "a" if append else "w", encoding="utf-8")
        except OSError as e:
            raise WriteFailed.of(e, self.path) from e
        if not append:
            self._write(self.header)

    def _write(self, entry: dict) -> None:
        try:
            self._file.write(json.dumps(entry) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:  # (a full disk: the command names the journal, `cli`)
            raise WriteFailed.of(e, self.path) from e

    def add(self, student: str, fingerprint: str, result: SubmissionResult, identical) -> None:
        if self.path is None:
            return
        if self._file is None:
            self._open(append=False)
        self._write({"student": student, "fingerprint": fingerprint, "result": result.to_plain(),
                     "identical": list(identical)})

    def finish(self) -> None:
        """The run is complete (its CSV written): the journal is no longer needed."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
