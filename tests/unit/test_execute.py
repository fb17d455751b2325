"""The executor: torch's global state is reset around every graded and self-check call, so a
notebook's global settings change no score, and the caller's settings come back afterwards."""
import contextlib
import io

import nbformat
import pytest
import torch

from autograder.shared.contract import CHAPTERS
from autograder.grading.grader import Grader
from autograder.references.solutions import load_reference
from autograder.selfcheck import check

from grading_helpers import REPO, failures, full, grade_in, namespace_of

# What a student might leave behind in a last cell (an inference demo, a float64 experiment, ...).
GLOBAL_STATE = """
import torch
torch.set_grad_enabled(False)
torch.set_default_dtype(torch.float64)
torch.set_anomaly_enabled(True)
torch.use_deterministic_algorithms(True)
"""


@contextlib.contextmanager
def notebook_global_state():
    """GLOBAL_STATE in this process, undone afterwards whatever happens."""
    saved = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.is_anomaly_enabled(),
             torch.are_deterministic_algorithms_enabled())
    exec(GLOBAL_STATE, {})
    try:
        yield
    finally:
        torch.set_grad_enabled(saved[0])
        torch.set_default_dtype(saved[1])
        torch.set_anomaly_enabled(saved[2])
        torch.use_deterministic_algorithms(saved[3])


@pytest.mark.parametrize("chapter", ["02_scaled_dot_product_attention", "04_positional_encoding"])
def test_global_torch_state_changes_no_score_and_is_restored(chapter):
    grade_in(chapter, namespace_of(chapter))  # the reference outcomes, cached, made in a clean state
    with notebook_global_state():
        result = grade_in(chapter, namespace_of(chapter))
        assert not torch.is_grad_enabled() and torch.get_default_dtype() == torch.float64
        assert torch.is_anomaly_enabled() and torch.are_deterministic_algorithms_enabled()
    for name, e in result.items():
        assert full(e), (name, failures(e))


def test_global_torch_state_changes_no_self_check():
    chapter = "02_scaled_dot_product_attention"
    ref = load_reference(chapter)
    with notebook_global_state(), contextlib.redirect_stdout(io.StringIO()):
        for ex in CHAPTERS[chapter].exercises:
            assert check(chapter, ex.name, ref[ex.target]) is True
        assert not torch.is_grad_enabled()


def test_a_last_cell_that_disables_gradients_changes_no_score_in_the_sandboxed_grader(tmp_path):
    chapter = "02_scaled_dot_product_attention"
    nb = nbformat.read(REPO / "solutions" / f"{chapter}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("torch.set_grad_enabled(False)  # inference demo"))
    path = tmp_path / f"{chapter}.ipynb"
    nbformat.write(nb, path)
    result = Grader(device="cpu").grade_path(path)
    (ch,) = result.chapters
    assert ch.score == ch.max_score, [(t.exercise, t.device, t.first_failure) for t in ch.tests]


def test_calls_from_several_threads_never_see_each_others_defaults():
    """The grader computes reference outcomes from one thread per chapter, and an `as_default`
    call (sinusoidal_positional_encoding) changes process-wide defaults: while one call runs,
    another must not change them under it (here A would build a float32 table in a float64
    call), nor leave them changed."""
    import threading

    from autograder.shared.calls import Call
    from autograder.runtime.execute import execute

    a_inside, b_inside, a_made = threading.Event(), threading.Event(), threading.Event()

    def table():  # A: made with the call's defaults, while B runs if B can run at all
        a_inside.set()
        b_inside.wait(0.5)
        t = torch.zeros(2)
        a_made.set()
        return t

    def other():  # B: an ordinary call, in torch's default float32
        b_inside.set()
        a_made.wait(0.5)
        return torch.zeros(2)

    call_a = Call("x", "table", "a", "table", as_default=True, dtype="float64")
    call_b = Call("x", "other", "b", "other")
    out = {}
    a = threading.Thread(target=lambda: out.setdefault("a", execute({"table": table}, call_a)))
    a.start()
    assert a_inside.wait(10)
    b = threading.Thread(target=lambda: out.setdefault("b", execute({"other": other}, call_b)))
    b.start()
    a.join(10)
    b.join(10)
    assert out["a"].meta[0]["dtype"] == "float64" and out["b"].meta[0]["dtype"] == "float32"
    assert torch.get_default_dtype() == torch.float32


def test_a_module_moved_to_fake_cuda_is_laid_out_as_on_a_gpu():
    """`module.to("cuda")` makes an expanded (overlapping) buffer contiguous and keeps a dense
    transposed one as it is: the device check's moved module does the same, so `.view` on it
    passes or fails as it would on a GPU."""
    from autograder.runtime.device_check import FakeCuda, move_module

    module = torch.nn.Module()
    module.register_buffer("expanded", torch.zeros(1, 4).expand(3, 4))
    module.register_buffer("transposed", torch.zeros(4, 3).t())
    with FakeCuda():
        move_module(module, "cuda", torch.float32)
        assert module.expanded.device.type == "cuda" and module.expanded.is_contiguous()
        assert module.expanded.view(12).shape == (12,)
        assert module.transposed.stride() == (1, 3)
