"""The memory case's own child: the one place where a student's memory is capped.

A memory case (`Call.capped_memory`, chapter 7's online softmax) is scored by whether it runs
where the kernel caps the child's memory far below the score matrix (`Limits.memory_case`
beyond what the child holds when it starts, the notebook's cells included). Only that case runs
there: the chapter's other cases, on every device, run in the ordinary children, whose memory a
GPU's driver may grow by hundreds of MiB after they start (CUDA loads its kernels lazily).

The capped child runs the notebook's cells again, then the memory cases, on the CPU with no
GPU visible; its address space is capped (RLIMIT_AS, which counts shared and file-backed
mappings too), every mapping it holds then is sealed (`runtime.confine.seal_mappings`: no
unmapping what the cap counted as taken), and a seccomp filter refuses anonymous shared
memory, memfd_create, shmget, sockets, new processes and new programs there
(`runtime.prepare.confine_memory_case`; the child exits before any student code runs where
that cannot be done, so the case fails rather than go unmeasured). Before its cap is
measured it imports the well-known libraries the cells import (`libraries_imported`,
`runtime.prepare.preimport`), so their code does not count against the case. Its crash or
timeout costs that case alone (`grading.judge`). It runs before
the chapter's other children start and is gone when they do, so no process of the chapter can
compute beside it.

A case that runs out of memory there is measured once more, in a child whose glibc maps each
large block of its own and unmaps it when freed (`runtime.prepare.map_large_blocks`). Honest
code that keeps a small tensor per block of keys (its running maximum, say) could otherwise
fail at random: the kept tensor lands in the hole a freed block left, and the heap grows by a
block per block (3 failures in 8 before this). The second run is slower (page faults on every
block), so it is paid only where the first ran out of memory on a request smaller than the cap
(one that could have fit: never the whole score matrix at once), and out of the student's own
budget; it can pass nothing that does not fit under the same cap. Where it times out or
crashes, the first run's outcome (its out-of-memory diagnosis) stands.
"""
from __future__ import annotations

import re

from ..shared.calls import Call, Outcome

_REQUEST = re.compile(r"tried to allocate (\d+) bytes")  # (torch's CPU allocator says so)
_OUT_OF_MEMORY = ("can't allocate memory", "not enough memory", "out of memory", "cannot allocate memory")


def libraries_imported(cells: list) -> tuple:
    """The modules of `prepare.LIBRARIES` that the cells import (`import scipy.stats`; `from
    matplotlib import pyplot` gives matplotlib and matplotlib.pyplot), read from their source
    without running it, for the capped child to import before its cap is measured: their code
    and buffers then do not count against the case (scipy, matplotlib and IPython.display took
    about 200 MiB of address space, and an honest solution lost the case, stop 49)."""
    import ast

    from ..runtime.prepare import LIBRARIES
    from ..source.submission import ParsedSubmission

    found: list[str] = []
    for tree in ParsedSubmission.of(cells).trees:  # (the chapter's own parse: not parsed again)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
            else:
                continue
            found += [n for n in names if n.split(".")[0] in LIBRARIES and n not in found]
    return tuple(found[:64])


def _key(call: Call) -> tuple:
    return (call.exercise, call.case, call.device, call.dtype)


def _worth_measuring_again(outcome: Outcome, cap: int) -> bool:
    """Whether a run failed for want of memory on a request that could have fit under the cap
    (a MemoryError, or an allocator's error asking for less than `cap` bytes): what a heap's
    holes can cause. Not a request of the cap or more (the whole score matrix), nor a timeout
    or a crash: a second run would fail again, out of the student's budget."""
    error = outcome.error or {}
    message = str(error.get("message", ""))
    request = _REQUEST.search(message)
    if request and int(request.group(1)) >= cap:
        return False
    return error.get("type") == "MemoryError" or any(w in message.lower() for w in _OUT_OF_MEMORY)


class MemoryCases:
    """The memory cases of one notebook's chapter, run first in a capped child of their own.

    `run_first()` runs them (once) and closes that child; `route(run)` gives a run function
    that answers those calls from what was measured and passes every other call to `run`. A
    memory call that was not run first gets a capped child of its own then: it never runs in an
    uncapped one."""

    def __init__(self, cells: list, calls: list[Call], **session_args):
        self.cells, self.calls = cells, [c for c in calls if c.capped_memory]
        self.session_args = session_args
        self.outcomes: dict[tuple, Outcome] = {}
        self.ran = False

    def run_first(self) -> None:
        if self.ran or not self.calls:
            return
        self.ran = True
        self.outcomes.update(zip(map(_key, self.calls), self._measured(self.calls)))

    def _measured(self, calls: list[Call]) -> list[Outcome]:
        """The calls' outcomes under the cap; those that ran out of memory, measured once more
        with each large block mapped of its own (the module's docstring says why)."""
        from .. import settings

        cap = (self.session_args.get("limits") or settings.current().limits).memory_case
        outcomes = self._run(calls)
        again = [i for i, outcome in enumerate(outcomes) if _worth_measuring_again(outcome, cap)]
        if again:
            for i, outcome in zip(again, self._run([calls[i] for i in again], mapped_heap=True)):
                if (outcome.error or {}).get("type") not in ("Timeout", "Crash"):
                    outcomes[i] = outcome
        return outcomes

    def _run(self, calls: list[Call], mapped_heap: bool = False) -> list[Outcome]:
        from .student_session import StudentSession

        with StudentSession(self.cells, memory_capped=True, mapped_heap=mapped_heap,
                            preimport=libraries_imported(self.cells), **self.session_args) as session:
            run = session.start()
            if run.error:
                why = f"the memory-capped process could not run the notebook: {run.error}"
                return [Outcome.failure("Crash", why) for _ in calls]
            return [session.run(c) for c in calls]

    def route(self, run):
        def routed(call: Call) -> Outcome:
            if not call.capped_memory:
                return run(call)
            outcome = self.outcomes.pop(_key(call), None)
            return outcome if outcome is not None else self._measured([call])[0]
        return routed
