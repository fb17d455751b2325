"""The reference outcomes of every case, computed once per grading run from the solutions (or read
from the instructor's store on disk, `references/store.py`) and shared by every student."""
from __future__ import annotations


import contextlib
import dataclasses
import threading


from .. import cases as case_registry
from ..shared.calls import Call, Outcome
from ..shared.contract import CHAPTERS
from ..runtime.execute import at_float32, execute
from ..references.solutions import load_reference
from ..grading.variants import variants


class ReferenceCache:
    """Reference outcomes, computed once per (call, device, dtype) and shared across submissions."""

    def __init__(self):
        self._lock = threading.Lock()
        self._outcomes: dict = {}
        self._pending: dict = {}  # key -> Event, while one thread computes that outcome
        self._cases: dict = {}

    def cases(self, chapter: str, exercise: str, seed: int, quick: bool) -> list[Call]:
        key = (chapter, exercise, seed, quick)
        with self._lock:
            if key not in self._cases:
                self._cases[key] = case_registry.build_cases(
                    chapter, exercise, load_reference(chapter), seed=seed, quick=quick)
            return self._cases[key]

    def expected(self, call: Call, key: tuple) -> Outcome:
        """The reference's outcome of `call`, computed once: a thread that asks while another
        computes the same outcome (`warm_in_background` and the grading loop) waits for it."""
        while True:
            with self._lock:
                hit = self._outcomes.get(key)
                if hit is not None:
                    return hit
                pending = self._pending.get(key)
                if pending is None:
                    pending = self._pending[key] = threading.Event()
                    break  # this thread computes it
            pending.wait()
        try:
            hit = execute(load_reference(call.chapter), call, trusted=True, record=False)
            with self._lock:
                self._outcomes[key] = hit
        finally:
            with self._lock:
                self._pending.pop(key, None)
            pending.set()
        return hit

    def with_float32(self, call: Call, key: tuple, expected: Outcome) -> Outcome:
        """`expected` with the reference's float32 run of the same case (Outcome.at_float32),
        computed only where a float64 result failed (most never need it) and kept with it."""
        if expected.at_float32 is not None or expected.error:
            return expected
        low = at_float32(load_reference(call.chapter), call)
        if low is None:
            return expected
        hit = dataclasses.replace(expected, at_float32=low)
        with self._lock:
            self._outcomes[key] = hit
        return hit

    @contextlib.contextmanager
    def warming(self, chapter_ids, devices: list[str], seed: int, quick: bool):
        """`warm` in a thread for the duration of the block: the grader computes reference
        outcomes while the student's sandbox starts and runs the notebooks (time it would
        otherwise spend waiting). The thread stops and is joined when the block ends (a thread
        still inside torch at interpreter exit aborts the process). A failure there costs
        nothing: the grading loop computes what is missing itself."""
        stop = threading.Event()

        def run():
            try:
                self.warm(chapter_ids, devices, seed, quick, stop)
            except Exception:
                pass
        thread = threading.Thread(target=run, name="reference-warm")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def warm(self, chapter_ids, devices: list[str], seed: int, quick: bool,
             stop: threading.Event | None = None) -> None:
        """Compute every reference outcome the grading of these chapters will ask for (until
        `stop` is set)."""
        for chapter_id in chapter_ids:
            # (the chapter's case module, which judging imports: here, while the student's
            # sandbox starts, rather than in the grading threads; cached cases do not import it)
            case_registry.chapter_module(chapter_id)
            for ex in CHAPTERS[chapter_id].exercises:
                cases = self.cases(chapter_id, ex.name, seed, quick)
                for device in devices:
                    for index, c in variants(cases, device):
                        if stop is not None and stop.is_set():
                            return
                        self.expected(c, reference_key(chapter_id, ex.name, seed, quick, index, c))

    def export(self, seed: int | None = None, quick: bool | None = None, cuda: bool = False,
               only_cuda: bool = False) -> dict:
        """The cases and CPU/meta outcomes (of one seed and quick setting, or all), as plain
        data for `wire`. CUDA outcomes stay out (they belong to one machine's GPU) unless
        `cuda` (for worker processes on this machine); `only_cuda`: those alone, without the
        cases (the store of one GPU, `references.store.cuda_tag`)."""
        def wanted(s, q):
            return (seed is None or s == seed) and (quick is None or q == quick)

        def device_wanted(k):
            return k[-2] == "cuda" if only_cuda else cuda or k[-2] != "cuda"
        with self._lock:
            cases = [] if only_cuda else [[list(k), [c.to_plain() for c in calls]]
                                          for k, calls in self._cases.items() if wanted(k[2], k[3])]
            outcomes = [[list(k), o.to_plain()] for k, o in self._outcomes.items()
                        if device_wanted(k) and wanted(k[2], k[3])]
        return {"cases": cases, "outcomes": outcomes}

    def merge(self, plain: dict) -> int:
        """Add what `export` gave (read back); how many outcomes were added. Data that does not
        fit adds nothing (it is then computed again)."""
        try:
            cases = {tuple(k): [Call.from_plain(c) for c in calls] for k, calls in plain["cases"]}
            outcomes = {tuple(k): Outcome.from_plain(o) for k, o in plain["outcomes"]}
        except (TypeError, ValueError, KeyError):
            return 0
        with self._lock:
            for k, calls in cases.items():
                self._cases.setdefault(k, calls)
            # new outcomes, and ones that now carry the reference's float32 run (with_float32)
            added = [k for k, o in outcomes.items() if k not in self._outcomes
                     or (o.at_float32 is not None and self._outcomes[k].at_float32 is None)]
            for k in added:
                self._outcomes[k] = outcomes[k]
        return len(added)

    def complete(self, chapter_ids, devices: list[str], seed: int, quick: bool) -> bool:
        """Whether every reference outcome these chapters need is here already."""
        with self._lock:
            for chapter_id in chapter_ids:
                for ex in CHAPTERS[chapter_id].exercises:
                    cases = self._cases.get((chapter_id, ex.name, seed, quick))
                    if cases is None:
                        return False
                    for device in devices:
                        for index, c in variants(cases, device):
                            if reference_key(chapter_id, ex.name, seed, quick, index, c) not in self._outcomes:
                                return False
        return True

    def count(self) -> int:
        with self._lock:
            return len(self._outcomes)

    def held(self, cuda: bool | None = None) -> int:
        """How much there is to store: outcomes, and the float32 runs attached to them (so that
        one added by with_float32 counts as new); of CUDA alone, of the others, or (None) all."""
        with self._lock:
            mine = [o for k, o in self._outcomes.items() if cuda is None or (k[-2] == "cuda") == cuda]
            return len(mine) + sum(o.at_float32 is not None for o in mine)

    def snapshot(self, cuda: bool = False) -> bytes:
        """Everything `export` gives, as one `wire` frame for worker processes of this grader."""
        from ..shared import wire

        return wire.encode(self.export(cuda=cuda))

    def adopt(self, data: bytes) -> None:
        from ..shared import wire

        self.merge(wire.decode(data))


REFERENCES = ReferenceCache()


def reference_key(chapter_id: str, exercise: str, seed: int, quick: bool, index: int, call: Call) -> tuple:
    return (chapter_id, exercise, seed, quick, index, call.device, call.dtype)
