"""Shared by every test module.

The tests are laid out like the package's concerns, one folder each:

    unit/      pure grader logic, in process: wire, compare, static checks, cases and hints,
               rules, reports, gradebook CSV, LMS import and export, similarity
    sandbox/   anything that starts a sandboxed child: the sandbox, warm worker and zygote,
               container mode, uids, memory case, GPU share, forgeries and attacks
    chapters/  each chapter's grading (test_grading_chNN.py for autograder/cases/chNN_*.py),
               the other exercise kinds, the references' cross-checks, the device check
    e2e/       whole runs of the command line: grade, batch, the runner, nbgrader, Gradescope
    course/    the course itself: the notebooks, the book's text, the site in a browser, the
               self-check of the exercises, the written answers

Test modules are named after what they test (test_compare, test_execute, test_wire, ...).
Helpers shared by several folders stay here, at the top: grading_helpers.py (grading a chapter
in process), ports.py, rules.py. This folder and each of the five above are put on sys.path
here, whatever pytest's import mode, so `from grading_helpers import ...` and imports of one
test module from another (`from test_sandbox import processes_with`) work from any folder.

Markers (declared in pyproject.toml, applied here, not in each file):

    sandbox      every test under sandbox/ (it starts a sandboxed child)
    browser      the tests that open chromium through Playwright (BROWSER_MODULES, BROWSER_TESTS)
    slow         tests that take more than about 5 s (SLOW below): `pytest -m "not slow"` is
                 the fast subset, a few minutes on 2 cores
    needs_bwrap  skipped, with the probe's reason, where bubblewrap cannot create namespaces
    cuda         needs a real CUDA GPU, skipped without one
"""
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
FOLDERS = ("unit", "sandbox", "chapters", "e2e", "course")
for _path in [str(HERE / f) for f in reversed(FOLDERS)] + [str(HERE)]:
    if _path not in sys.path:
        sys.path.insert(0, _path)

# The grader commands that tests run keep their reference outcomes in a folder of this test run
# (shared by its tests, as by one instructor's runs), never in the user's own cache.
os.environ.setdefault("AUTOGRADER_CACHE_DIR", tempfile.mkdtemp(prefix="autograder-test-cache-"))
# Tests are no graded deployment: `batch` and the Gradescope bundle may use the public built-in seed
# (inputs.course_seed; tests/sandbox/test_attacks_round2.py checks the refusal without this).
os.environ.setdefault("AUTOGRADER_ALLOW_PUBLIC_SEED", "1")


# Tests that open chromium through Playwright (besides every test of these modules).
BROWSER_MODULES = ("course/test_site.py",)
BROWSER_TESTS = ("unit/test_class_report.py::test_the_class_report_in_a_browser",)

# Tests that take more than about 5 s (measured with --durations=0 on 2 shared cores), left out
# of the fast subset `pytest -m "not slow"`: a module ("folder/test_x.py") or a test
# ("folder/test_x.py::test_name", every parameter of it). Each entry says what makes it slow.
SLOW: dict[str, str] = {
}


def _where(item) -> tuple[str, str]:
    """("folder/test_x.py", "test_name") of an item, relative to this folder."""
    path = Path(str(item.path)).resolve()
    try:
        module = path.relative_to(HERE).as_posix()
    except ValueError:
        return "", ""
    return module, item.originalname if hasattr(item, "originalname") else item.name


def _in(module: str, name: str, listed) -> bool:
    return module in listed or f"{module}::{name}" in listed


_BUBBLEWRAP: list = []


def _bubblewrap_skip():
    """The skip of `needs_bwrap` tests, or None where bubblewrap runs (probed once)."""
    if not _BUBBLEWRAP:
        from autograder.sandbox.modes import probe_bubblewrap
        ok, why, _ = probe_bubblewrap()
        _BUBBLEWRAP.append(None if ok else pytest.mark.skip(reason=f"bubblewrap unavailable: {why}"))
    return _BUBBLEWRAP[0]


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    """The markers by folder and by the lists above; `needs_bwrap` tests skipped where
    bubblewrap cannot create namespaces, `cuda` tests where there is no GPU, each said so."""
    no_gpu = None if torch.cuda.is_available() else pytest.mark.skip(
        reason="needs a CUDA GPU (run with -m cuda on a GPU machine: tools/gpu_check.sh)")
    for item in items:
        module, name = _where(item)
        if module.startswith("sandbox/"):
            item.add_marker(pytest.mark.sandbox)
        if _in(module, name, BROWSER_MODULES + BROWSER_TESTS):
            item.add_marker(pytest.mark.browser)
        if _in(module, name, SLOW):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("needs_bwrap") and (skip := _bubblewrap_skip()):
            item.add_marker(skip)
        if item.get_closest_marker("cuda") and no_gpu:
            item.add_marker(no_gpu)


@pytest.fixture(autouse=True)
def default_torch_state():
    """Every test starts with torch's global defaults and leaves them so (grad mode, default
    dtype), whatever a test (or a student variant it runs in process) changed."""
    grad, dtype = torch.is_grad_enabled(), torch.get_default_dtype()
    yield
    torch.set_grad_enabled(grad)
    torch.set_default_dtype(dtype)
