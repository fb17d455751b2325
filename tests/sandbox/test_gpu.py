"""Tests that need a real CUDA GPU (marked `cuda`: skipped elsewhere; run them with
`pytest -m cuda` or tools/gpu_check.sh). No GPU was at hand when they were written: what they
check is simulated in test_memory_case.py and test_gpu_share.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autograder.grading.grader import Grader
from session_helpers import lone_session

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cuda


def test_chapter7_scores_full_marks_with_cuda_rows():
    """Issue 26: chapter 7's CUDA rows ran out of host memory under the memory case's cap."""
    (chapter,) = Grader(device="cuda").grade_path(REPO / "solutions" / "07_efficient_attention.ipynb").chapters
    failing = [(t.exercise, t.device, c.case, c.message) for t in chapter.tests for c in t.cases if not c.passed]
    assert chapter.score == chapter.max_score == 28, failing
    assert any(t.device == "cuda" for t in chapter.tests)


def test_a_child_gets_its_share_of_the_gpu_only():
    """Limits.gpu_share is torch's memory fraction in every child, set before student code."""
    from autograder.shared.calls import Call
    from autograder.sandbox.limits import Limits

    cell = ("import torch\n"
            "def grab(x, share):\n"
            "    total = torch.cuda.get_device_properties(0).total_memory\n"
            "    try:\n"
            "        t = torch.empty(int(total * float(share)), dtype=torch.uint8, device='cuda')\n"
            "        return x + 1\n"
            "    except torch.OutOfMemoryError:\n"
            "        return x - 1\n")
    with lone_session([cell], limits=Limits.from_env(gpu_share=0.3)) as s:
        assert s.start().error is None
        small = s.run(Call("t", "grab", "small", "grab", args=[torch.zeros(1), 0.1]))
        large = s.run(Call("t", "grab", "large", "grab", args=[torch.zeros(1), 0.5]))
    assert small.outputs[0].tolist() == [1.0], small.error
    assert large.outputs[0].tolist() == [-1.0], large.error
