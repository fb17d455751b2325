"""The executor: torch's global state is reset around every graded and self-check call, so a
notebook's global settings change no score, and the caller's settings come back afterwards; an
exception a signal handler of the grader's own process raises during a trusted call is no outcome."""
import contextlib
import io
import signal

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


def test_a_module_moved_for_the_device_check_is_laid_out_as_on_a_gpu():
    """`module.to("cuda")` makes an expanded (overlapping) buffer contiguous and keeps a dense
    transposed one as it is: the device check's moved module does the same, so `.view` on it
    passes or fails as it would on a GPU."""
    from autograder.runtime.device_check import FakeCuda, move_module

    module = torch.nn.Module()
    module.register_buffer("expanded", torch.zeros(1, 4).expand(3, 4))
    module.register_buffer("transposed", torch.zeros(4, 3).t())
    with FakeCuda():
        move_module(module, "cuda", torch.float32)
        assert module.expanded.device.type == "meta" and module.expanded.is_contiguous()
        assert module.expanded.view(12).shape == (12,)
        assert module.transposed.stride() == (1, 3)


class HostTimeout(BaseException):
    """What a test runner's timeout raises from its SIGALRM handler (pytest-timeout's `Failed`)."""


@contextlib.contextmanager
def host_handler_raising_on_sigusr1():
    """A handler of this process's own that raises HostTimeout on SIGUSR1, as pytest-timeout's
    raises `Failed` on SIGALRM, wherever the main thread is when the signal comes."""
    def handler(signum, frame):
        raise HostTimeout("Timeout >600.0s")
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def softmax_signalled_on_fake_cuda(namespace: dict) -> dict:
    """`namespace` with a softmax during whose device check the host's signal comes:
    what a loaded machine did to chapter 8's TinyTransformer when the test's 600 s ran out."""
    real = namespace["softmax"]

    def softmax(x, *args, **kwargs):
        if x.device.type == "meta":  # (the device check's GPU)
            signal.raise_signal(signal.SIGUSR1)
        return real(x, *args, **kwargs)
    return {**namespace, "softmax": softmax}


def test_a_host_signal_during_trusted_grading_stops_it_instead_of_costing_points():
    chapter = CHAPTERS["01_intuition"]
    namespace = softmax_signalled_on_fake_cuda(load_reference(chapter.id))
    with host_handler_raising_on_sigusr1(), pytest.raises(HostTimeout):
        Grader(device="cpu").grade_namespace(chapter, namespace, exercises=["softmax"])


def test_a_host_signal_while_a_reference_is_computed_caches_no_outcome(monkeypatch):
    from autograder.references import cache
    from autograder.grading.variants import variants

    reference = load_reference("01_intuition")
    references = cache.ReferenceCache()
    calls = references.cases("01_intuition", "softmax", 0, True)
    index, call = variants(calls, "fake-cuda")[0]
    key = cache.reference_key("01_intuition", "softmax", 0, True, index, call)
    monkeypatch.setattr(cache, "load_reference", lambda _: softmax_signalled_on_fake_cuda(reference))
    with host_handler_raising_on_sigusr1(), pytest.raises(HostTimeout):
        references.expected(call, key)
    assert references.count() == 0
    monkeypatch.setattr(cache, "load_reference", lambda _: reference)
    assert references.expected(call, key).error is None


def test_student_code_that_raises_a_base_exception_is_still_an_outcome():
    """Untrusted code (a sandboxed child, a self-check) may raise anything: it is recorded."""
    from autograder.shared.calls import Call
    from autograder.runtime.execute import execute

    def leaves():
        raise SystemExit(1)
    out = execute({"leaves": leaves}, Call("x", "leaves", "exits", "leaves"))
    assert out.error["type"] == "SystemExit"
