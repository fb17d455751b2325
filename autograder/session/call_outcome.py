"""What a child says one graded call returned, as far as the grader believes it: `believed`."""
from __future__ import annotations

from ..shared import protocol
from ..shared.calls import Call, ErrorKind, Outcome
from .trust import expected_error_credible, traceback_in_source, validated


def believed(event: protocol.CallDone, call: Call, cells, name: str) -> Outcome | None:
    """The child's answer checked field by field (`validated`; None where it is malformed), its
    error's traceback against the notebook's source, and an expected error's kind only where
    the notebook's own raise says so. cells: the notebook's `ParsedSubmission` (or its cells)."""
    outcome = validated(event.outcome)
    if outcome is None:
        return None
    if not traceback_in_source(outcome.error, cells):
        return Outcome.failure("Crash", f"{name} reported an error whose traceback does not "
                               "match the notebook's code")
    if call.expect_error and outcome.error and ErrorKind.of(outcome.error) is None and \
            not expected_error_credible(outcome.error, call.expect_error, cells, call.target):
        # the child's claim of the error is not believed: its kind is what the
        # notebook's own raise statement says, nothing more
        outcome.error["mro"] = [outcome.error.get("type", "")]
        if call.expect_error in outcome.error["mro"]:
            outcome.error["where"] = ""  # a claim without a raise in the notebook
    return outcome
