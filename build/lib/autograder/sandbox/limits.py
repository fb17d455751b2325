"""What a student's process may use, and what its death by a limit is called: `Limits`, read once
from the environment (AUTOGRADER_*), with the messages for each signal and exit."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, fields


NOBODY = 65534

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


@dataclass
class Limits:
    """What one student's child process may use. Defaults are documented here and in the README.

    Every field can be set from the environment as AUTOGRADER_<FIELD NAME IN CAPITALS>
    (sizes accept K/M/G suffixes: AUTOGRADER_MEMORY=8G); see `Limits.from_env`.
    """

    cell_timeout: float = 10.0          # seconds for one top-level cell
    call_timeout: float = 10.0          # seconds for one graded call
    notebook_timeout: float = 120.0     # seconds for all cells together (start-up of a session)
    student_budget: float = 300.0       # seconds of grading for one student's whole submission:
                                        # what is left when it runs out scores zero, said so
    watchdog_margin: float = 300.0      # batch: a worker still at one student this long after
                                        # their budget ran out is killed (`error`); it covers what
                                        # the budget does not count (start-up, comparisons, reports)
    startup_timeout: float = 60.0       # seconds for the child to start (Python + torch import)
    grace: float = 2.0                  # after a timeout the child interrupts itself; this long
                                        # later the parent kills it (student code that swallows
                                        # the interrupt or blocks in C)
    memory: int = 4 * GiB               # RLIMIT_DATA (and RLIMIT_AS = 2x where no GPU)
    cpu_seconds: int = 600              # RLIMIT_CPU, per process (a backstop; timeouts are wall)
    nproc: int = 256                    # tasks (processes + threads), see the module docstring
    file_size: int = 64 * MiB           # RLIMIT_FSIZE, largest file the child may write
    tmp_size: int = 256 * MiB           # size of the sandbox's /tmp (bubblewrap mode)
    nofile: int = 256                   # open file descriptors
    output_cap: int = 64 * KiB          # captured stdout+stderr kept per session start / per call
    result_cap: int = 256 * MiB         # largest result frame accepted from the child
    memory_case: int = 192 * MiB        # a memory case (Call.capped_memory) runs in a child of
                                        # its own that may allocate this much beyond what it holds
                                        # at its start, the notebook's cells included (hard
                                        # RLIMIT_DATA and RLIMIT_AS, set before any student code
                                        # runs: the kernel, not the student, enforces it; see
                                        # autograder.session.memory_case)
    threads: int = 1                    # torch intra-op threads (determinism, parallel grading)
    gpu_share: float = 0.9              # torch's per-process CUDA memory fraction in a student's
                                        # children, set before any student code runs (`batch`
                                        # gives each of its --jobs workers 0.9 / jobs; see
                                        # autograder.sandbox.gpu_share)
    # The grader's own deadlines and bounds (not the student's):
    send_timeout: float = 30.0          # to hand the notebook's cells to a child
    control_timeout: float = 10.0       # for the warm worker to fork, kill or reset
    exit_wait: float = 2.0              # for a child that closed its pipes to report its exit
    kill_wait: float = 10.0             # for a killed process to be reaped
    kill_rounds: int = 20               # passes over /proc to stop a fallback child's processes
    drain_cap: int = 8 * MiB            # output read from a killed child before giving up on it

    @classmethod
    def from_env(cls, **overrides) -> "Limits":
        """Defaults, then AUTOGRADER_<FIELD> environment variables, then `overrides`."""
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f"AUTOGRADER_{f.name.upper()}")
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
