"""The hint engine (autograder/cases/__init__.py): one matching rule for every chapter."""
import torch

from autograder.shared.calls import Call, Outcome
from autograder.cases import Hints, Mistake, exercise_hint, matches, model_hint
from autograder.grading.compare import Mismatch

X = torch.arange(6, dtype=torch.float64).reshape(2, 3)
CALL = Call(chapter="x", exercise="f", case="c", target="f", args=[X])
RIGHT = Outcome(outputs=[X * 2])


def _spec(**kw):
    mistakes = (Mistake("times three", lambda c: c.args[0] * 3),
                Mistake("plus one", lambda c: c.args[0] * 2 + 1),
                Mistake("also times three", lambda c: c.args[0] * 3, when=lambda c: False))
    return Hints(kw.pop("mistakes", mistakes), correct=kw.pop("correct", lambda c: c.args[0] * 2), **kw)


def test_the_one_mistake_that_explains_the_outcome_is_named():
    assert model_hint(_spec(), CALL, Outcome(outputs=[X * 3]), RIGHT) == "times three"
    assert model_hint(_spec(), CALL, Outcome(outputs=[X * 2 + 1]), RIGHT) == "plus one"
    assert model_hint(_spec(), CALL, Outcome(outputs=[X * 5]), RIGHT) is None


def test_no_hint_when_two_mistakes_explain_it_or_the_correct_model_disagrees_with_the_reference():
    twice = (Mistake("a", lambda c: c.args[0] * 3), Mistake("b", lambda c: c.args[0] + c.args[0] * 2))
    assert model_hint(_spec(mistakes=twice), CALL, Outcome(outputs=[X * 3]), RIGHT) is None
    same = (Mistake("a", lambda c: c.args[0] * 3), Mistake("a", lambda c: c.args[0] + c.args[0] * 2))
    assert model_hint(_spec(mistakes=same), CALL, Outcome(outputs=[X * 3]), RIGHT) == "a"
    assert model_hint(_spec(correct=lambda c: c.args[0]), CALL, Outcome(outputs=[X * 3]), RIGHT) is None


def test_a_mistake_that_the_reference_also_shows_explains_nothing():
    spec = _spec(mistakes=(Mistake("no-op", lambda c: c.args[0] * 2 + 0 * c.args[0][0, 0]),))
    assert model_hint(spec, CALL, RIGHT, RIGHT) is None


def test_nan_never_matches():
    """NaN equal to NaN is no evidence for a mistake model, and NaN weights are not zero ones
    (a NaN the reference lacks is diagnosed by where it is: tests/unit/test_nonfinite_hints.py)."""
    nan_row = torch.tensor([[float("nan"), float("nan")], [1.0, 2.0]])
    zero_row = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    assert not matches(nan_row, zero_row) and not matches(nan_row, nan_row)
    assert not matches(zero_row, nan_row) and matches(zero_row, zero_row.clone())


def test_explain_runs_first_and_weights_right_is_the_last_resort():
    m = Mismatch("values", "differs", output=0)
    spec = _spec(explain=lambda c, s, e, mm: "explained" if mm.aspect == "params" else None,
                 weights_right="weights right, output wrong")
    assert exercise_hint(spec, CALL, Outcome(outputs=[X * 3]), RIGHT, Mismatch("params", "p")) == "explained"
    student = Outcome(outputs=[X * 5, X])
    expected = Outcome(outputs=[X * 2, X])
    assert exercise_hint(spec, CALL, student, expected, m) == "weights right, output wrong"
