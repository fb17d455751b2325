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

# Tests that take more than about 5 s (measured with --durations=0 on the 2 cores of a machine
# shared with other work, load average 8 to 10), left out of the fast subset
# `pytest -m "not slow"`: a module ("folder/test_x.py") or a test ("folder/test_x.py::test_name",
# every parameter of it). Each entry says what makes it slow.
SLOW: dict[str, str] = {
    # unit/
    "unit/test_compare.py::test_correct_but_different_passes_in_half_precision":
        "16 formulations, each graded in float16 and bfloat16",
    "unit/test_rules.py::test_chance_dependent_mistakes_are_caught_at_every_seed_by_grader_and_self_check":
        "grades and self-checks a mistake at 20 seeds",
    "unit/test_nonfinite_hints.py::test_an_online_softmax_that_divides_by_zero_on_a_fully_masked_query_is_told_so":
        "grades chapter 7 (its memory case)",
    "unit/test_nonfinite_hints.py::test_zero_times_inf_is_told_as_such": "grades two chapters",
    "unit/test_class_report.py": "grades a class with batch, regrades through the command line, a browser",
    "unit/test_lms_import.py::test_an_imported_canvas_class_is_graded_by_batch": "`import` and `batch` as commands",
    "unit/test_reference_store.py::test_the_command_line_stores_and_reuses_outcomes": "`grade` twice as a command",
    "unit/test_reference_store.py::test_stored_outcomes_grade_exactly_like_computed_ones": "grades a chapter twice",
    "unit/test_execute.py::test_global_torch_state_changes_no_score_and_is_restored": "grades every chapter",
    "unit/test_execute.py::test_a_last_cell_that_disables_gradients_changes_no_score_in_the_sandboxed_grader":
        "grades a notebook in the sandbox",
    "unit/test_gradebook.py::test_the_gradebook_imports_as_canvas_expects": "grades a class with batch",
    "unit/test_gradescope_feedback.py::test_a_zip_in_the_submission_is_unpacked_and_a_missing_chapter_scores_zero":
        "grades a submission as Gradescope's runner does",
    # chapters/: a chapter's suite grades its reference and each mistake in process, a second or
    # more a test idle, several under load; chapter 1's suite stays in the fast subset
    "chapters/test_device_check.py": "grades each chapter's device mistakes on fake CUDA",
    "chapters/test_feedback.py": "grades every port of public code",
    "chapters/test_grading.py": "grades every chapter's reference and stubs",
    "chapters/test_grading_ch02.py": "grades chapter 2's mistakes",
    "chapters/test_grading_ch03.py": "grades chapter 3's mistakes",
    "chapters/test_grading_ch04.py": "grades chapter 4's mistakes",
    "chapters/test_grading_ch05.py": "grades chapter 5's mistakes",
    "chapters/test_grading_ch06.py": "grades chapter 6's mistakes",
    "chapters/test_grading_ch07.py": "grades chapter 7's mistakes",
    "chapters/test_grading_ch08.py": "grades chapter 8's mistakes, trains the reference model",
    "chapters/test_grading_kinds.py": "grades every chapter's written answers and bug fixes",
    "chapters/test_references.py": "172 cross-checks of the references, against loops and PyTorch",
    # sandbox/: every module starts children (a few seconds each, under load ten); SMOKE below stays
    "sandbox/test_attacks_round2.py": "batch runs of hostile classes",
    "sandbox/test_container_mode.py": "the Gradescope bundle run as Gradescope runs it",
    "sandbox/test_forgery.py": "grades forged notebooks in the sandbox",
    "sandbox/test_gpu.py": "grades on a GPU",
    "sandbox/test_gpu_share.py": "batch runs with a stand-in GPU",
    "sandbox/test_hostile_frames.py": "a child per frame, a batch",
    "sandbox/test_memory_case.py": "grades chapter 7 with the memory case, as a command too",
    "sandbox/test_sandbox.py": "a child (or several) per test",
    "sandbox/test_student_uids.py": "two students' sandboxes at once",
    "sandbox/test_warm.py": "warm workers and their children",
    "sandbox/test_zygote.py": "the zygote and its sandboxes",
    # e2e/: whole runs of the command line
    "e2e/test_batch.py": "grades a class",
    "e2e/test_batch_robust.py": "grades classes with a time budget, a killed worker, shards",
    "e2e/test_clean_reports.py": "grades a hostile class",
    "e2e/test_grade_notebooks.py": "grades every chapter's notebooks through the command line",
    "e2e/test_integrations.py": "nbgrader and the Gradescope bundle, end to end",
    "e2e/test_runner.py": "virtual environments and the command line",
    # course/
    "course/test_site.py": "builds the book, then opens every page in chromium",
    "course/test_notebooks.py::test_solution_notebook_runs": "executes a notebook in a kernel",
    "course/test_notebooks.py::test_exercise_notebook_runs_with_only_self_checks_failing":
        "executes a notebook in a kernel",
    "course/test_selfcheck.py::test_the_self_check_flags_what_the_grader_penalises_and_passes_correct_code":
        "self-checks every mistake of the chapter suites",
    "course/test_selfcheck.py::test_the_self_check_names_the_symptom_of_the_unchanged_bug_not_the_fix":
        "self-checks and grades each unfixed bug",
    "course/test_selfcheck.py::test_committed_fixtures_match_the_references": "rebuilds the self-check data",
    "course/test_written_answers.py::test_the_self_check_data_hold_no_answer": "rebuilds the self-check data",
    "course/test_student_package.py::test_nothing_in_the_student_package_scores_an_exercise_in_full":
        "tries every function of the student package on every exercise",
    "course/test_student_package.py::test_the_scan_finds_the_answers_the_mistake_models_hold":
        "tries the mistake models on two chapters' exercises",
    "course/test_student_package.py::test_the_self_check_says_what_the_graders_judge_says":
        "self-checks every mistake of the chapter suites twice",
    "course/test_written_answers.py::test_no_written_answer_can_be_computed_from_the_package":
        "tries many values through the package's hints",
    "course/test_written_answers.py::test_brute_force_gets_the_same_verdict_for_right_and_wrong_answers":
        "self-checks many values",
}
# Kept in the fast subset although their module is slow: the sandbox's smoke tests.
SMOKE = (
    "sandbox/test_sandbox.py::test_no_network_not_even_loopback",
    "sandbox/test_sandbox.py::test_infinite_loop_in_a_function_times_out_and_the_next_call_works",
)


def pytest_configure(config):
    """Each entry of the lists above names a module and test that exist (a renamed test would
    otherwise leave the list silently)."""
    for entry in [*SLOW, *SMOKE, *BROWSER_MODULES, *BROWSER_TESTS]:
        module, _, name = entry.partition("::")
        path = HERE / module
        if not path.is_file() or (name and f"def {name}(" not in path.read_text()):
            raise pytest.UsageError(f"tests/conftest.py names {entry}, which is not there")


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
        if _in(module, name, SLOW) and not _in(module, name, SMOKE):
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
