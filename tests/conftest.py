"""Shared by every test module.

Test modules are named after what they test: test_<module>.py for autograder/<module>.py
(test_compare, test_execute, test_grading, test_selfcheck, test_batch, test_wire, ...), and
test_grading_chNN.py for the cases and hints of autograder/cases/chNN_*.py. Helpers shared by
the chapter suites are in grading_helpers.py (importable from any test module: this folder is
put on sys.path here, whatever pytest's import mode).
"""
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# The grader commands that tests run keep their reference outcomes in a folder of this test run
# (shared by its tests, as by one instructor's runs), never in the user's own cache.
os.environ.setdefault("AUTOGRADER_CACHE_DIR", tempfile.mkdtemp(prefix="autograder-test-cache-"))
# Tests are no graded deployment: `batch` and the Gradescope bundle may use the public built-in seed
# (inputs.course_seed; tests/test_attacks_round2.py checks the refusal without this).
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
