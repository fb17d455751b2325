"""The task an exercise sets (the contract's `Exercise.task`): implement code, write an answer, or
find the bug. The contract's `kind` says how the graded name is reached (a function, a module, a
method, a plain value); the task says what the student is asked to do with it, and so which
checks it gets. Each decision that depends on the task is an attribute here, named for the
place that makes it; the grader's side of a task (its cases, hints and comparison) is
`autograder/cases/kinds.py`.

Staged into the sandbox with `shared/` (the self-check asks `value`), so it imports nothing."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str
    value: bool = False          # a value the student writes, read rather than called (Call.answer):
    #                              the self-check looks at its form only, and reports can hold it back
    portable: bool = True        # code: a CPU test and a device-portability test (grading/scoring.py)
    code_checked: bool = True    # its source is read for forbidden built-ins and in-place changes
    #                              (source/findings.py)
    similarity_compared: bool = True  # written from scratch, so compared between students
    #                                   (report/similarity.py)


IMPLEMENT = Task("implement")
# "Predict the output": a number or nested list of numbers, graded once, on the CPU, to 0.01.
WRITTEN_ANSWER = Task("written answer", value=True, portable=False, code_checked=False,
                      similarity_compared=False)
# The notebook shows a buggy function; the student writes the corrected one, graded like any
# function, but a right fix of the given code is usually the solution's: not compared.
FIND_THE_BUG = Task("find the bug", similarity_compared=False)

TASKS = (IMPLEMENT, WRITTEN_ANSWER, FIND_THE_BUG)
