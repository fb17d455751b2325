"""The task an exercise sets (implement, written answer, find the bug) is what the contract
declares (`Exercise.task`, shared/kinds.py), never read off the exercise's name: every exercise
of the contract has a task whose strategy (cases/kinds.py) exists, and an exercise declared a
fix without the `fixed_` prefix, or named `fixed_*` but declared one to implement, gets the
treatment of its declared task at every place that decides by the task."""
from __future__ import annotations

import dataclasses

import pytest

from autograder import cases
from autograder.cases.kinds import STRATEGIES, FindTheBug, Implement, WrittenAnswer
from autograder.grading.scoring import exercise_tests
from autograder.report.similarity import compared
from autograder.shared.calls import Call
from autograder.shared.contract import CHAPTERS, Chapter, Exercise
from autograder.shared.kinds import FIND_THE_BUG, IMPLEMENT, TASKS, WRITTEN_ANSWER
from autograder.source.findings import EMPTY, findings

CH1 = "01_intuition"


def test_every_exercise_declares_a_task_that_has_a_strategy():
    assert set(STRATEGIES) == set(TASKS)
    for chapter in CHAPTERS.values():
        tasks = [ex.task for ex in chapter.exercises]
        assert set(tasks) <= set(TASKS), chapter.id
        assert tasks.count(WRITTEN_ANSWER) == 1 and tasks.count(FIND_THE_BUG) == 1, chapter.id


def test_a_value_is_exactly_a_written_answer():
    with pytest.raises(ValueError):
        Exercise("predict_something", "answer", 1)  # (a value left as an implement task)
    with pytest.raises(ValueError):
        Exercise("a_function", "function", 1, task=WRITTEN_ANSWER)


def test_the_declared_task_decides_not_the_name():
    repair = Exercise("repair_rows", "function", 2, task=FIND_THE_BUG)
    prefixed = Exercise("fixed_rows", "function", 2)  # (an implement task, whatever its name)
    answer = Exercise("rows_answer", "answer", 1, task=WRITTEN_ANSWER)
    assert not compared(repair) and compared(prefixed) and not compared(answer)
    assert [d for d, _ in exercise_tests(repair, ["cpu", "cuda"])] == ["cpu", "cuda"]
    assert exercise_tests(answer, ["cpu", "cuda"]) == [("cpu", 1.0)]
    cells = ["def repair_rows(x):\n    x.mul_(2)\n    return x\n", "def rows_answer(x):\n    x.mul_(2)\n    return x\n"]
    found = findings(cells, Chapter("99_test", "test", (repair, answer)), {
        "repair_rows": {None: {"x"}}, "rows_answer": {None: {"x"}}})
    assert found["repair_rows"].inplace and found["rows_answer"] is EMPTY


def test_the_cases_strategy_follows_the_declared_task(monkeypatch):
    """Declared otherwise, the same exercise gets the other task's strategy: its hints (own or
    with the engine's convention hints) and its comparison."""
    chapter = CHAPTERS[CH1]
    call = Call(chapter=CH1, exercise="fixed_softmax_rows", case="c", target="fixed_softmax_rows")
    assert isinstance(cases._strategy(CH1, "fixed_softmax_rows"), FindTheBug)
    assert cases._spec(call)[1] is True
    as_implement = tuple(dataclasses.replace(ex, task=IMPLEMENT) if ex.name == "fixed_softmax_rows" else ex
                         for ex in chapter.exercises)
    monkeypatch.setitem(CHAPTERS, CH1, dataclasses.replace(chapter, exercises=as_implement))
    assert isinstance(cases._strategy(CH1, "fixed_softmax_rows"), Implement)
    assert not isinstance(cases._strategy(CH1, "fixed_softmax_rows"), (FindTheBug, WrittenAnswer))
    assert cases._spec(call)[1] is False
