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


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` need a real GPU: skipped, said so, where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m cuda on a GPU machine: tools/gpu_check.sh)")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def default_torch_state():
    """Every test starts with torch's global defaults and leaves them so (grad mode, default
    dtype), whatever a test (or a student variant it runs in process) changed."""
    grad, dtype = torch.is_grad_enabled(), torch.get_default_dtype()
    yield
    torch.set_grad_enabled(grad)
    torch.set_default_dtype(dtype)
