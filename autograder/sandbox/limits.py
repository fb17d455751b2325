"""What a student's process may use, and what its death by a limit is called: `Limits`, read once
from the environment (AUTOGRADER_*), with the messages for each signal and exit."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field, fields


NOBODY = 65534

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


def _student(help: str) -> dict:
    return {"help": help}


def _grader(help: str) -> dict:
    return {"help": help, "grader": True}  # the grader's own deadlines and bounds, not the student's


@dataclass
class Limits:
    """What one student's child process may use. Defaults are documented here and in the README.

    Every field can be set from the environment as AUTOGRADER_<FIELD NAME IN CAPITALS>
    (sizes accept K/M/G suffixes: AUTOGRADER_MEMORY=8G); see `Limits.from_env`.
    """

    cell_timeout: float = field(default=10.0, metadata=_student('seconds for one top-level cell'))
    call_timeout: float = field(default=10.0, metadata=_student('seconds for one graded call'))
    notebook_timeout: float = field(default=120.0, metadata=_student(
        'seconds for all cells together (start-up of a session)'))
    student_budget: float = field(default=300.0, metadata=_student(
        "seconds of grading for one student's whole submission: what is left when it runs out scores "
        'zero, said so'))
    watchdog_margin: float = field(default=300.0, metadata=_student(
        'batch: a worker still at one student this long after their budget ran out is killed (`error`); '
        'it covers what the budget does not count (start-up, comparisons, reports)'))
    startup_timeout: float = field(default=60.0, metadata=_student(
        'seconds for the child to start (Python + torch import)'))
    grace: float = field(default=2.0, metadata=_student(
        'after a timeout the child interrupts itself; this long later the parent kills it (student code '
        'that swallows the interrupt or blocks in C)'))
    memory: int = field(default=4 * GiB, metadata=_student('RLIMIT_DATA (and RLIMIT_AS = 2x where no GPU)'))
    cpu_seconds: int = field(default=600, metadata=_student(
        'RLIMIT_CPU, per process (a backstop; timeouts are wall)'))
    nproc: int = field(default=256, metadata=_student(
        'tasks (processes + threads), counted per user (as root, per student uid)'))
    file_size: int = field(default=64 * MiB, metadata=_student(
        'RLIMIT_FSIZE, largest file the child may write'))
    tmp_size: int = field(default=256 * MiB, metadata=_student(
        "size of the sandbox's /tmp (bubblewrap mode)"))
    nofile: int = field(default=256, metadata=_student('open file descriptors'))
    output_cap: int = field(default=64 * KiB, metadata=_student(
        'captured stdout+stderr kept per session start / per call'))
    result_cap: int = field(default=256 * MiB, metadata=_student(
        'largest result frame accepted from the child'))
    memory_case: int = field(default=192 * MiB, metadata=_student(
        'a memory case (Call.capped_memory) runs in a child of its own that may allocate this much beyond'
        " what it holds at its start, the notebook's cells included (hard RLIMIT_DATA and RLIMIT_AS, set "
        'before any student code runs: the kernel, not the student, enforces it; see '
        'autograder.session.memory_case)'))
    threads: int = field(default=1, metadata=_student(
        'torch intra-op threads (determinism, parallel grading)'))
    gpu_share: float = field(default=0.9, metadata=_student(
        "torch's per-process CUDA memory fraction in a student's children, set before any student code "
        'runs (`batch` gives each of its --jobs workers 0.9 / jobs; see autograder.sandbox.gpu_share)'))
    send_timeout: float = field(default=30.0, metadata=_grader("to hand the notebook's cells to a child"))
    control_timeout: float = field(default=10.0, metadata=_grader(
        'for the warm worker to fork, kill or reset'))
    exit_wait: float = field(default=2.0, metadata=_grader(
        'for a child that closed its pipes to report its exit'))
    kill_wait: float = field(default=10.0, metadata=_grader('for a killed process to be reaped'))
    kill_rounds: int = field(default=20, metadata=_grader(
        "passes over /proc to stop a fallback child's processes"))
    drain_cap: int = field(default=8 * MiB, metadata=_grader(
        'output read from a killed child before giving up on it'))

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "Limits":
        """Defaults, then AUTOGRADER_<FIELD> variables of `environ` (default os.environ), then
        `overrides`. The entry points read them once, with every other setting
        (`autograder.settings.Settings.from_env`)."""
        env = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = env.get(f"AUTOGRADER_{f.name.upper()}")
            if raw:
                try:
                    values[f.name] = _parse(raw, f.type)
                except ValueError:
                    raise ValueError(f"AUTOGRADER_{f.name.upper()}={raw!r} is not a valid "
                                     f"{f.type}") from None
        values.update(overrides)
        return cls(**values)


def _parse(raw: str, type_) -> float | int:
    raw = raw.strip()
    if type_ in (float, "float"):
        return float(raw)
    scale = {"K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}.get(raw[-1:].upper(), 1)
    number = raw[:-1] if scale != 1 else raw
    return int(float(number) * scale)


def describe_exit(rc: int | None, limits: Limits, shell_convention: bool = False) -> str:
    """A return code (Popen's convention: -N for signal N) in words; with shell_convention,
    128+N also means signal N (bubblewrap reports its child's death that way)."""
    if rc is None:
        return "is still running"
    sig = -rc if rc < 0 else (rc - 128 if shell_convention and 128 < rc < 160 else 0)
    if sig:
        return describe_signal(sig, limits)
    return f"exited with status {rc} (os._exit, sys.exit from a thread, or a fatal error)"


def describe_signal(sig: int, limits: Limits) -> str:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    why = {
        signal.SIGKILL: f"was killed ({name}), usually by the memory limit "
                        f"({limits.memory / GiB:g} GiB) or the system running out of memory",
        signal.SIGSEGV: f"crashed with a segmentation fault ({name})",
        signal.SIGBUS: f"crashed with a bus error ({name})",
        signal.SIGABRT: f"aborted ({name})",
        signal.SIGXCPU: f"used more than {limits.cpu_seconds} s of CPU time ({name})",
        signal.SIGXFSZ: f"wrote a file larger than {limits.file_size / MiB:g} MiB ({name})",
        signal.SIGFPE: f"crashed with a floating point exception ({name})",
    }
    return why.get(sig, f"was killed by {name}")


def time_now() -> float:
    import time

    return time.monotonic()


def _shown(value) -> str:
    if isinstance(value, int) and value >= KiB and value % KiB == 0:
        for unit, size in (("G", GiB), ("M", MiB), ("K", KiB)):
            if value % size == 0:
                return f"{value // size}{unit}"
    return f"{value:g}"


def limits_table() -> str:
    """Every limit as a Markdown table (the README's, and `python -m autograder --help-limits`),
    from the fields' own help: one source, so the two cannot disagree."""
    rows = ["| variable | default | what it bounds |", "|---|---|---|"]
    for grader_side in (False, True):
        for f in fields(Limits):
            if bool(f.metadata.get("grader")) == grader_side:
                help_ = ("(the grader's own) " if grader_side else "") + f.metadata["help"]
                rows.append(f"| `AUTOGRADER_{f.name.upper()}` | {_shown(f.default)} | {help_.replace('|', '/')} |")
    return "\n".join(rows)
