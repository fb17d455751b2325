"""The grader's side of each task an exercise sets (`shared/kinds.py`): where its cases and hints
come from, and how its outcome is compared with the reference's. cases/__init__.py asks the
exercise's strategy (`strategy`) for each.

- implement: the chapter module's cases, mistake models and comparison (chNN_*.py);
- written answer: one call that reads the value (Call.answer), its hints of likely wrong answers
  (the instructor's table), compared to 0.01 by written_answers.py;
- find the bug: a few small cases and the bug's symptom (other_kinds.py), compared like any
  function of the chapter.
Written answers and fixes keep to their own hints (`own_hints`): the engine's hints about
ported code (conventions, float32-level differences) do not apply to them."""
from __future__ import annotations

from ..grading import compare as generic
from ..shared.calls import Call, Outcome
from ..shared.kinds import FIND_THE_BUG, IMPLEMENT, WRITTEN_ANSWER
from . import chapter_module, call
from . import other_kinds, written_answers


class Implement:
    own_hints = False

    def cases(self, chapter: str, exercise: str, gen, ref: dict, quick: bool) -> list[Call]:
        return chapter_module(chapter).cases(exercise, gen, ref, quick)

    def hints(self, chapter: str, exercise: str):
        return chapter_module(chapter).HINTS.get(exercise)

    def compare(self, call: Call, student: Outcome, expected: Outcome, notes: list | None):
        own = getattr(chapter_module(call.chapter), "compare", None)
        return (own or generic.compare)(call, student, expected, notes)


class WrittenAnswer(Implement):
    own_hints = True

    def cases(self, chapter, exercise, gen, ref, quick):
        return [call("your written answer", answer=True)]

    def hints(self, chapter, exercise):
        return other_kinds.HINTS.get((chapter, exercise))

    def compare(self, call, student, expected, notes):
        return written_answers.compare_answer(call, student, expected)


class FindTheBug(Implement):
    own_hints = True

    def cases(self, chapter, exercise, gen, ref, quick):
        return other_kinds.CASES[chapter, exercise](gen, ref, quick)

    def hints(self, chapter, exercise):
        return other_kinds.HINTS.get((chapter, exercise))


STRATEGIES = {IMPLEMENT: Implement(), WRITTEN_ANSWER: WrittenAnswer(), FIND_THE_BUG: FindTheBug()}


def strategy(ex):
    """The strategy of an exercise of the contract (`Exercise.task`)."""
    return STRATEGIES[ex.task]
