"""A StudentSession on its own, for tests: the test owns the student's warm sandboxes as an entry
point of the grader does (`sandbox.pool.student_pool`, none unless bubblewrap), hands them to
the session, and closes them after it."""
from __future__ import annotations

from contextlib import contextmanager

from autograder.sandbox.limits import Limits
from autograder.sandbox.modes import resolve_sandbox
from autograder.sandbox.pool import student_pool
from autograder.session.student_session import StudentSession


@contextmanager
def lone_session(cells, limits: Limits | None = None, sandbox="auto", hide=(), **kwargs):
    limits = limits or Limits.from_env()
    choice = resolve_sandbox(sandbox)
    pool = student_pool(choice, limits, hide)
    try:
        with StudentSession(cells, limits, sandbox=choice, hide=hide, sandboxes=pool, **kwargs) as session:
            yield session
    finally:
        if pool is not None:
            pool.close()
