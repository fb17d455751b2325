"""What students install holds no working answer (issue 27, item 5).

The student package (`tools/build_student_dist.py`: the self-check, its data and what it needs of
the package) must not contain the grader's cases, mistake models or references, must run alone,
and must judge as the grader does; and nothing defined in it may score an exercise in full, even
wrapped to the exercise's signature the way a student wrapped chapter 7's mistake-free model
(`_online`, which scored 10/10 when the package held the models)."""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from autograder.grading.grader import Grader
from autograder.references.solutions import load_reference
from autograder.runtime.execute import execute
from autograder.shared.calls import Call, Outcome
from autograder.shared.contract import CHAPTERS
from autograder.selfcheck import _fixtures, run_checks
from autograder.selfcheck.verdict import judge

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import build_student_dist  # noqa: E402

GRADER_SIDE = ("cases/", "references/", "sandbox/", "session/", "source/", "report/", "batch/", "lms/",
               "integrations/", "grading/judge.py", "grading/grader.py", "cli.py")


def test_the_student_package_holds_none_of_the_graders_side():
    """What the self-check imports, followed to the end, includes no case builder, mistake model,
    reference or grader: of grading/, only the comparison rule and the device variants."""
    files = build_student_dist.student_files()
    assert "selfcheck/hint_engine.py" in files and "data/selfcheck.agw" in files
    assert not [f for f in files if f.startswith(GRADER_SIDE)], files
    assert {f for f in files if f.startswith("grading/")} == {"grading/__init__.py", "grading/compare.py",
                                                             "grading/variants.py"}


def test_the_closure_would_see_an_import_of_the_mistake_models(tmp_path, monkeypatch):
    """The check above can fail: a self-check module that imports the mistake models puts them
    in the student package."""
    package = tmp_path / "autograder"
    for rel in build_student_dist.student_files() | {"cases/__init__.py", "cases/mistake_models.py"}:
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_bytes((REPO / "autograder" / rel).read_bytes())
    leak = package / "selfcheck" / "leak.py"
    leak.write_text("from ..cases.mistake_models import linear\n")
    monkeypatch.setattr(build_student_dist, "PACKAGE", package)
    assert "cases/mistake_models.py" in build_student_dist.student_files()


# ------------------------------------------------------------------ the built distribution alone
CORRECT_AND_BUGGY = """
import json, sys, torch
import autograder
from autograder.selfcheck import check

def causal_mask(seq_len, device=None):
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()

def scaled_dot_product_attention(q, k, v, mask=None):  # unscaled
    s = q @ k.transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.nan_to_num(torch.softmax(s, -1))
    return w @ v, w

ok = check("05_masks", "causal_mask", causal_mask)
bad = check("02_scaled_dot_product_attention", "scaled_dot_product_attention", scaled_dot_product_attention,
            raise_on_failure=False)
try:
    import autograder.cases
    cases = "importable"
except ImportError:
    cases = "absent"
print(json.dumps({"ok": ok, "bad": bad, "cases": cases, "package": autograder.__file__,
                  "modules": sorted(m.__file__ for n, m in sys.modules.items()
                                    if n.startswith("autograder") and getattr(m, "__file__", None))}))
"""


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_built_distribution_self_checks_alone(tmp_path):
    """Built as a course that does not publish solutions ships it: the self-check passes a correct
    function and diagnoses an unscaled attention, with the package's own hint, from the
    distribution alone; the grader's modules are not there."""
    out = tmp_path / "dist"
    build_student_dist.build(out)
    assert sorted(p.name for p in (out / "exercises").glob("*.ipynb")) == \
        sorted(p.name for p in (REPO / "exercises").glob("*.ipynb"))
    assert 'name = "attention-course-student"' in (out / "pyproject.toml").read_text()
    # -S: no site hooks, so no editable install of the whole course on this machine is seen;
    # torch comes from its own folder, after the distribution
    site_packages = Path(torch.__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-S", "-c", CORRECT_AND_BUGGY], cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": f"{out}:{site_packages}", "PATH": "/usr/bin:/bin"},
                         timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["ok"] is True and report["bad"] is False and report["cases"] == "absent"
    assert "hint: scores look unscaled" in run.stdout
    assert report["package"].startswith(str(out))
    shipped = {str(out / "autograder" / f) for f in build_student_dist.student_files()}
    assert set(report["modules"]) <= shipped, set(report["modules"]) - shipped


# ------------------------------------------------------------------ no answer in what ships
def _defined_functions(module) -> list[tuple[str, object]]:
    """Every function and class `module` defines, and the functions its module-level tables hold
    (an EXPLAIN dict's closures, a tuple of models)."""
    found = []
    for name, obj in vars(module).items():
        if name.startswith("__"):  # (__builtins__, __loader__, ...: not the module's own)
            continue
        if (callable(obj) and getattr(obj, "__module__", None) == module.__name__) or isinstance(obj, type):
            found.append((name, obj))
        elif isinstance(obj, (dict, list, tuple)):
            values = obj.values() if isinstance(obj, dict) else obj
            found += [(f"{name}[{i}]", v) for i, v in enumerate(values) if callable(v)]
    return found


def _as_model(fn, ex, chapter: str):
    """`fn(call)` -> outputs, wrapped to the exercise's signature as a student would wrap it: the
    call's arguments in a Call (a module's weights from its own state dict), outputs cast to the
    inputs' dtype, several outputs as a tuple."""
    def outputs(call: Call, like: torch.dtype):
        out = fn(call)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        out = [o.to(like) if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in out]
        return tuple(out) if len(out) > 1 else out[0]

    def dtype_of(values) -> torch.dtype:
        return next((v.dtype for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()),
                    torch.get_default_dtype())

    if ex.kind == "function":
        def wrapped(*args, **kwargs):
            call = Call(chapter, ex.name, "scan", ex.target, args=list(args), kwargs=kwargs)
            return outputs(call, dtype_of(list(args) + list(kwargs.values())))
        return wrapped
    base = load_reference(chapter)[ex.owner or ex.target]  # its layers stand in for the student's own

    def method(self, *args, **kwargs):
        state = {k: v.detach() for k, v in self.state_dict().items()}
        call = Call(chapter, ex.name, "scan", ex.target, init=self.scan_init, state=state, args=list(args),
                    kwargs=kwargs, train=self.training)
        return outputs(call, dtype_of(list(args) + list(state.values())))

    def init(self, **kwargs):
        base.__init__(self, **kwargs)
        self.scan_init = kwargs
    return type("Wrapped", (base,), {"__init__": init, ex.name if ex.kind == "method" else "forward": method})


class _TooLong(Exception):
    pass


def _passes_quick_cases(chapter: str, ex, obj) -> bool:
    """Whether `obj` passes every quick CPU case of the exercise (the self-check's data), each call
    cut off after 5 s."""
    def stop(*_):
        raise _TooLong()
    old = signal.signal(signal.SIGALRM, stop)
    try:
        for entry in _fixtures()[f"{chapter}/{ex.name}"]:
            c = Call.from_plain(entry["call"])
            signal.alarm(5)
            try:
                student = execute({ex.target: obj}, c)
            finally:
                signal.alarm(0)
            if judge(ex, c, student, Outcome.from_plain(entry["expected"]), entry["hints"],
                     entry.get("probe")).mismatch is not None:
                return False
        return True
    except _TooLong:
        return False
    finally:
        signal.signal(signal.SIGALRM, old)


def full_cpu_scores(module_names, chapters=None) -> list[tuple[str, str, str]]:
    """(chapter, exercise, candidate) for every function or class defined in the modules that,
    as it is or wrapped as a model (`_as_model`), scores every CPU test of an exercise in full.
    Each candidate is tried in a child process of its own: called with an exercise's arguments,
    some (`wire.save(obj, 1)`) would close this process's files."""
    found, seen = [], set()
    for module in module_names:
        for name, obj in _defined_functions(importlib.import_module(module)):
            if id(obj) in seen:  # (one table entry is often a function defined above it)
                continue
            seen.add(id(obj))
            exercises = _in_child(lambda: _full_scores_of(module, name, chapters))
            found += [(chapter, exercise, f"{module}.{name}") for chapter, exercise in exercises]
    return found


def _full_scores_of(module: str, name: str, chapters) -> list[tuple[str, str]]:
    obj = dict(_defined_functions(importlib.import_module(module)))[name]
    grader, found = Grader(device="cpu"), []
    for chapter in chapters or CHAPTERS:
        for ex in CHAPTERS[chapter].exercises:
            if ex.kind == "answer":
                continue
            tries = [obj] if (ex.kind == "function") != isinstance(obj, type) else []
            tries += [] if isinstance(obj, type) else [_as_model(obj, ex, chapter)]
            for candidate in tries:
                if not _passes_quick_cases(chapter, ex, candidate):
                    continue
                ns = dict(load_reference(chapter), **{ex.target: candidate})
                tests = grader.grade_namespace(CHAPTERS[chapter], ns, [ex.name])
                if all(t.score == t.max_score for t in tests if t.device == "cpu"):
                    found.append((chapter, ex.name))
    return found


def _in_child(work):
    """work()'s JSON-able result, computed in a forked child with its output sent to /dev/null."""
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        pid = os.fork()
        if pid == 0:  # the child: whatever happens, it ends here
            code = 1
            try:
                # One thread: torch's OpenMP pool does not survive a fork, and after earlier tests
                # ran parallel ops in this process, the child's first one waited forever.
                torch.set_num_threads(1)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                value = work()
                result.write_text(json.dumps(value))
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"the scan's child failed ({status})"
        return [tuple(v) for v in json.loads(result.read_text())]


def _student_modules() -> list[str]:
    return sorted("autograder." + f.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                  for f in build_student_dist.student_files() if f.endswith(".py") and f != "__init__.py")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nothing_in_the_student_package_scores_an_exercise_in_full():
    """Every function and class of the student package, as it is and wrapped as a model of every
    exercise (the L1 attack), against the grader's cases: none scores an exercise's CPU tests in
    full (the device-portability share is a `device=` edit away, so it is not counted)."""
    modules = _student_modules()
    assert "autograder.selfcheck.hint_engine" in modules and len(modules) >= 20
    assert full_cpu_scores(modules) == []


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_scan_finds_the_answers_the_mistake_models_hold():
    """The scan above can fail: pointed at the grader's mistake models of chapters 2 and 7, it
    finds their mistake-free models as working answers. (Chapter 7's `_online`, the attack's
    model, wrapped as it is, now misses one CPU case: NaN gradients through a fully -inf row, a
    rule case added since; the student's edits gave it full marks.)"""
    found = full_cpu_scores(["autograder.cases.ch02_scaled_dot_product_attention",
                             "autograder.cases.ch07_efficient_attention"],
                            ["02_scaled_dot_product_attention", "07_efficient_attention"])
    assert {("02_scaled_dot_product_attention", "scaled_dot_product_attention",
             "autograder.cases.ch02_scaled_dot_product_attention.attend"),
            ("07_efficient_attention", "repeat_kv", "autograder.cases.ch07_efficient_attention._repeat"),
            ("07_efficient_attention", "sliding_window_mask",
             "autograder.cases.ch07_efficient_attention._window")} <= set(found), found


# ------------------------------------------------------------------ the grader's verdicts
def _graders_checks(chapter: str, exercise: str, obj) -> list[tuple]:
    """The self-check as it ran before the split: each quick case judged by the grader's own
    `judge`, its hints from the mistake models themselves."""
    from autograder.cases.other_kinds import symptoms_only
    from autograder.grading.judge import forbidden_message, judge as graders_judge
    from autograder.grading.compare import Mismatch
    from autograder.grading.variants import variants
    from autograder.runtime.device_check import FAKE_CUDA, unchecked

    ex = CHAPTERS[chapter].exercise(exercise)
    ns, results = {ex.target: obj}, []
    entries = _fixtures()[f"{chapter}/{exercise}"]
    with symptoms_only():
        for entry in entries:
            c = Call.from_plain(entry["call"])
            verdict = graders_judge(ex, c, execute(ns, c), Outcome.from_plain(entry["expected"]))
            m = verdict.mismatch
            if m is None and verdict.forbidden:
                m = Mismatch("forbidden", forbidden_message(ex, verdict.forbidden))
            results.append((c, m, verdict.note))
            if m:
                return results
        if entries[0]["expected_meta"] is not None:
            (_, c), = variants([Call.from_plain(entries[0]["call"])], FAKE_CUDA)
            student = execute(ns, c)
            m = graders_judge(ex, c, student, Outcome.from_plain(entries[0]["expected_meta"])).mismatch
            results.append((c, None if unchecked(student) else m, ""))
    return results


def _said(results) -> list[tuple]:
    return [(c.case, c.device, m and (m.aspect, m.message, m.hint), note) for c, m, note in results]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_self_check_says_what_the_graders_judge_says():
    """On every mistake of the chapter suites (BUGGY) and every correct variant: the same case,
    aspect, message, hint and note as the grader's `judge` with the mistake models themselves."""
    from grading_helpers import namespace_of
    from test_selfcheck import _chapter_variants

    compared, differ = 0, []
    for chapter, buggy, correct in _chapter_variants():
        variants = [(name, exercise, src) for name, exercise, src, _ in buggy]
        variants += [(name, None, src) for name, src in [("reference", "")] + list(correct)]
        for name, only, src in variants:
            ns = namespace_of(chapter, src)
            for ex in CHAPTERS[chapter].exercises:
                if ex.kind == "answer" or (only and ex.name != only):
                    continue
                compared += 1
                mine, graders = _said(run_checks(chapter, ex.name, ns[ex.target])), \
                    _said(_graders_checks(chapter, ex.name, ns[ex.target]))
                if mine != graders:
                    differ.append((chapter, name, ex.name, mine, graders))
    assert compared >= 200
    assert not differ, differ[:3]


def test_the_graders_hints_use_the_student_packages_rules():
    """One place per rule: each exercise's `explain` in the grader's mistake tables is the one the
    student package holds (`selfcheck.rules`), and so is each chapter's comparison."""
    from autograder import cases
    from autograder.selfcheck import rules

    for chapter in CHAPTERS:
        for ex in CHAPTERS[chapter].exercises:
            spec = getattr(cases.chapter_module(chapter), "HINTS", {}).get(ex.name)
            if spec is not None:
                assert spec.explain is rules.explain(chapter, ex.name), (chapter, ex.name)
        own = getattr(rules.chapter_rules(chapter), "compare", None)
        graders = getattr(cases.chapter_module(chapter), "compare", None)
        assert (own is None) == (graders is None), chapter
        if own is not None and chapter != "08_transformer":  # (chapter 8 adds the models' probe)
            assert graders is own, chapter


def test_a_find_the_bug_hint_is_stored_as_a_symptom_without_its_fix():
    """The data keep the bug's symptom in words, never the grader's fix."""
    from autograder.cases.other_kinds import HINTS, fix_text

    for (chapter, exercise), spec in HINTS.items():
        if not exercise.startswith("fixed_"):
            continue
        texts = [t for e in _fixtures()[f"{chapter}/{exercise}"] for _, t in e["hints"]["bugs"] if t]
        assert texts, exercise
        assert not [t for t in texts if fix_text(chapter, exercise) in t or "The fix:" in t], exercise


def test_the_stored_predictions_are_the_models_own():
    """A spot check of the data against the models: every stored prediction of chapter 2's quick
    cases is what the mistake model computes now (the full data are compared by
    test_selfcheck.test_committed_fixtures_match_the_references)."""
    from autograder.cases.selfcheck_data import stored_hints

    for entry in _fixtures()["02_scaled_dot_product_attention/scaled_dot_product_attention"]:
        c = Call.from_plain(entry["call"])
        fresh = stored_hints(c, Outcome.from_plain(entry["expected"]))
        assert [t for t, _ in fresh["mistakes"]] == [t for t, _ in entry["hints"]["mistakes"]]
        for (_, a), (_, b) in zip(fresh["mistakes"], entry["hints"]["mistakes"]):
            assert a.keys() == b.keys()
            if "ok" in a:
                assert all((x is None and y is None) or torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))
                           for x, y in zip(a["ok"], b["ok"]))

