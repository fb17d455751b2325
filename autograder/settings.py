"""Every setting of the grader, read from the environment once: `Settings.from_env()`.

The entry points (the command line, the Gradescope runner, the nbgrader preprocessor) read it
once and hand the object down: to the `Grader` (its seed, limits and sandbox request), to the
batch's worker processes (pickled with the grader and given to each worker when it starts, not
copied through environment variables), to the importer. What lies deeper and is asked from many
places (where the solutions and the cache are, what is hidden from students' code, the uid
range) reads `current()`: the settings the entry point installed (`installed`), or, where no
entry point did (the package used as a library: tests, a notebook), the environment as it is now.

The variables (see the README's configuration section; the limits are in its limits table,
`python -m autograder --help-limits`):

- AUTOGRADER_SEED: the course's secret input seed (`seed`)
- AUTOGRADER_ALLOW_PUBLIC_SEED=1: accept the public built-in seed for a graded deployment
- AUTOGRADER_SOLUTIONS: the solution notebooks' folder (default <repo>/solutions)
- AUTOGRADER_CACHE_DIR: the reference outcomes' cache (off: none), else
  $XDG_CACHE_HOME/attention-autograder, else ~/.cache/attention-autograder
- AUTOGRADER_HIDE: more paths hidden from students' code (os.pathsep separated)
- AUTOGRADER_SANDBOX: auto, bubblewrap, container or none
- AUTOGRADER_UID_RANGE: students' uids as root, "62000-62999"
- AUTOGRADER_<LIMIT>: each field of `sandbox.limits.Limits`

Nothing here is staged into the sandbox: the code beside students' code (`runtime/`,
`shared/`) reads no setting of the grader's.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

from .sandbox.limits import Limits

REPO_DIR = Path(__file__).resolve().parents[1]

DEFAULT_UID_RANGE = (62000, 62999)
MAX_STUDENT_ZIP_BYTES = 256 << 20


def _help(text: str, variable: str | None = None) -> dict:
    return {"help": text, "variable": variable}


@dataclass(frozen=True)
class Settings:
    """What the grader is told by its environment, read once (`from_env`)."""

    seed: int | None = field(default=None, metadata=_help(
        "the course's secret input seed; unset: `grade` uses the public built-in one and a graded "
        "deployment (batch, Gradescope, nbgrader) refuses to grade", "AUTOGRADER_SEED"))
    allow_public_seed: bool = field(default=False, metadata=_help(
        "1: a graded deployment accepts the public built-in seed (tests, demonstrations)",
        "AUTOGRADER_ALLOW_PUBLIC_SEED"))
    solutions: Path = field(default=REPO_DIR / "solutions", metadata=_help(
        "the folder of the solution notebooks (the references)", "AUTOGRADER_SOLUTIONS"))
    cache: Path | None = field(default=None, metadata=_help(
        "the reference outcomes' cache folder (`off`: no cache); default "
        "$XDG_CACHE_HOME/attention-autograder, else ~/.cache/attention-autograder", "AUTOGRADER_CACHE_DIR"))
    hide: tuple[str, ...] = field(default=(), metadata=_help(
        "more paths hidden from students' code, os.pathsep separated (results, hidden test data)",
        "AUTOGRADER_HIDE"))
    sandbox: str = field(default="auto", metadata=_help(
        "how students' code is isolated: auto, bubblewrap, container or none (--sandbox)", "AUTOGRADER_SANDBOX"))
    uid_range: tuple[int, int] = field(default=DEFAULT_UID_RANGE, metadata=_help(
        "the uids students' code runs as when the grader is root, first-last", "AUTOGRADER_UID_RANGE"))
    limits: Limits = field(default_factory=Limits, metadata=_help(
        "what a student's code may use: one variable per limit (`--help-limits`)", "AUTOGRADER_<LIMIT>"))
    max_student_zip_bytes: int = field(default=MAX_STUDENT_ZIP_BYTES, metadata=_help(
        "`import`: the zips of one student unpacked in all"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> "Settings":
        """The defaults, then the AUTOGRADER_* variables of `environ` (default os.environ), then
        `overrides`. ValueError names a variable that cannot be read."""
        env = os.environ if environ is None else environ
        values: dict = {}
        raw = env.get("AUTOGRADER_SEED", "").strip()
        if raw:
            try:
                values["seed"] = int(raw)
            except ValueError:
                raise ValueError(f"AUTOGRADER_SEED={raw!r} is not a whole number") from None
        values["allow_public_seed"] = env.get("AUTOGRADER_ALLOW_PUBLIC_SEED") == "1"
        if env.get("AUTOGRADER_SOLUTIONS"):
            values["solutions"] = Path(env["AUTOGRADER_SOLUTIONS"])
        values["cache"] = _cache_dir(env)
        values["hide"] = tuple(p for p in env.get("AUTOGRADER_HIDE", "").split(os.pathsep) if p)
        values["sandbox"] = (env.get("AUTOGRADER_SANDBOX") or "auto").lower()
        values["uid_range"] = _uid_range(env.get("AUTOGRADER_UID_RANGE", ""))
        values["limits"] = Limits.from_env(env)
        values.update(overrides)
        return cls(**values)


def _cache_dir(env: Mapping[str, str]) -> Path | None:
    explicit = env.get("AUTOGRADER_CACHE_DIR")
    if explicit is not None:
        return None if explicit.strip().lower() in ("", "off", "0", "none") else Path(explicit)
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attention-autograder"


def _uid_range(raw: str) -> tuple[int, int]:
    """(first, last) of "62000-62999"; the default for anything else."""
    try:
        first, last = (int(x) for x in raw.split("-"))
        if 1000 <= first <= last < 2 ** 31 - 1:
            return first, last
    except ValueError:
        pass
    return DEFAULT_UID_RANGE


_INSTALLED: list[Settings] = []


def current() -> Settings:
    """The settings an entry point installed, else the environment's now (library use)."""
    return _INSTALLED[-1] if _INSTALLED else Settings.from_env()


@contextlib.contextmanager
def installed(settings: Settings):
    """`settings` are `current()` for the block (an entry point's run)."""
    _INSTALLED.append(settings)
    try:
        yield settings
    finally:
        _INSTALLED.remove(settings)


def install(settings: Settings) -> None:
    """`settings` are `current()` for the rest of this process (a batch worker's)."""
    _INSTALLED[:] = [settings]


def settings_table() -> str:
    """The settings as a Markdown table (the README's configuration section)."""
    rows = ["| variable | what it sets |", "|---|---|"]
    for f in fields(Settings):
        if f.metadata.get("variable"):
            rows.append(f"| `{f.metadata['variable']}` | {f.metadata['help']} |")
    return "\n".join(rows)
