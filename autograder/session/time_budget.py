"""The student's time budget (`Limits.student_budget`, for the whole submission): the sentinel
that says it is spent, and the sentence the report gives for it."""
from __future__ import annotations

from enum import Enum

from ..sandbox.limits import Limits


class Spent(Enum):
    """Why a session stopped without an error of the student's or the grader's making."""

    BUDGET = "budget spent"


# What starting the notebook again gives instead of a reason when the student's budget is
# spent: the call then fails as a Timeout (`budget_message`), not as a crash.
BUDGET_SPENT = Spent.BUDGET


def budget_message(limits: Limits) -> str:
    return (f"not graded: this student's time budget ({limits.student_budget:g} s of grading for the whole "
            "submission, AUTOGRADER_STUDENT_BUDGET) ran out")
