"""Grading a submission: the grader, comparing outcomes, results."""
