"""nbgrader: a course folder built from the solutions, graded by the sandboxed grader.

`make_course(course_dir)` writes an nbgrader course (nbgrader_config.py and
source/<assignment>/NN_name.ipynb). Each self-check cell of the solutions becomes an nbgrader
grade cell worth the exercise's points, which shows the student their self-check.

Grading never happens in the student's kernel: there, every earlier cell of the student's can
patch whatever the grade cell calls, so any score the kernel computes can be forged. The course's
config replaces nbgrader's `Execute` step of `nbgrader autograde` with `SandboxedGrades`, which
grades the submitted notebook with this package's grader (student code in its sandbox, scores
computed in the grader's own process, exactly as `python -m autograder grade` does) and writes
each grade cell's outputs: the diagnosis as text and the exercise's points as nbgrader partial
credit, which nbgrader's own `SaveAutoGrades` then stores in the gradebook. No student code runs
in a kernel at all.

    python -m autograder.integrations.nbgrader COURSE_DIR [--assignment attention]
    cd COURSE_DIR && nbgrader generate_assignment attention && ... && nbgrader autograde attention
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer, List, Unicode

from ..shared.contract import CHAPTERS, chapter_for_filename
from ..references.solutions import solutions_dir

CHECK_CALL = re.compile(r'check\(\s*"(?P<chapter>[^"]+)"\s*,\s*"(?P<exercise>[^"]+)"\s*,\s*(?P<obj>[^)]+)\)')

GRADE_CELL = '''from autograder.selfcheck import check
check("{chapter}", "{exercise}", {obj}, raise_on_failure=False)'''

CONFIG = '''import os

from autograder.integrations.nbgrader import AUTOGRADE_PREPROCESSORS, GENERATE_PREPROCESSORS

c = get_config()
# The course is the folder this file is in (wherever it is moved or copied to).
course = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.root = course
c.CourseDirectory.course_id = "attention-course"
# Written answers are released as `predict_x = ...`, as in the exercise notebooks.
c.GenerateAssignment.preprocessors = GENERATE_PREPROCESSORS
# Grades come from the sandboxed grader, never from the student's kernel (see
# autograder/integrations/nbgrader.py): nbgrader's Execute step is replaced by SandboxedGrades.
c.Autograde.autograde_preprocessors = AUTOGRADE_PREPROCESSORS
# What a student's code must never read, even where the sandbox is a uid of its own
# (a container without namespaces): the whole course folder, submissions and gradebook included.
c.SandboxedGrades.hide = [course]
# The course's secret input seed (made once with the course: the built-in one is public).
c.SandboxedGrades.seed = __SEED__
'''


class SandboxedGrades(NbGraderPreprocessor):
    """In place of nbgrader's Execute: grade the notebook in the sandbox and write each grade
    cell's outputs from the result (text, then the points as an execute_result)."""

    device = Unicode("auto", help="auto, cpu or cuda, as `python -m autograder grade --device`").tag(config=True)
    sandbox = Unicode("auto", help="auto, bubblewrap, container or none, as `--sandbox`").tag(config=True)
    hide = List(Unicode(), help="folders a student's uid must not read in the container mode").tag(config=True)
    seed = Integer(None, allow_none=True, help="the course's input seed (else $AUTOGRADER_SEED)").tag(config=True)

    _grader = None
    _graded: dict = {}  # (student, assignment) -> {chapter id: ChapterResult}: the current student's only

    def preprocess(self, nb, resources):
        name = resources["nbgrader"]["notebook"]
        chapter = chapter_for_filename(name + ".ipynb")
        if chapter is None:
            raise ValueError(f"{name}.ipynb is not a chapter notebook of this course")
        key = (resources["nbgrader"]["student"], resources["nbgrader"]["assignment"])
        graded = SandboxedGrades._graded.get(key)
        if graded is None or chapter.id not in graded:
            start = time.perf_counter()
            graded = self._grade_student(nb, chapter, resources)
            SandboxedGrades._graded = {key: graded}
            self.log.info("graded %s's %d notebooks in %.1f s", key[0], len(graded), time.perf_counter() - start)
        result = graded.pop(chapter.id, None)  # (graded once: a second autograde run grades it again)
        if result is None:
            raise RuntimeError(f"{name}.ipynb: the grader did not grade it")
        tests: dict = {}
        for t in result.tests:
            tests.setdefault(t.exercise, []).append(t)
        from ..report.gradescope import is_sandbox_note

        notes = [n for n in result.notes if not is_sandbox_note(n)]
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
                continue
            match = CHECK_CALL.search(cell.source)
            exercise = match["exercise"] if match and match["chapter"] == chapter.id else None
            cell.outputs = _grade_outputs(tests.get(exercise), exercise, float(meta.get("points", 0)), notes)
            notes = []  # (the notebook's own notes once, in its first grade cell)
        return nb, resources

    def _grader_once(self):
        from ..grading.grader import Grader
        from ..sandbox.modes import SandboxUnavailable, resolve_sandbox

        if SandboxedGrades._grader is None:
            from ..settings import Settings

            settings = Settings.from_env()  # (read once, for every notebook: the grader keeps them)
            try:  # decided once, for every notebook
                sandbox = resolve_sandbox(self.sandbox if self.sandbox != "auto" else settings.sandbox, self.hide)
            except SandboxUnavailable as e:
                raise RuntimeError(f"no grading without the sandbox: {e}") from None
            if sandbox.mode != "bubblewrap":
                self.log.warning(sandbox.note)
            from ..cases.inputs import course_seed
            SandboxedGrades._grader = Grader(device=self.device, sandbox=sandbox, settings=settings,
                                             seed=course_seed(self.seed, settings))
        return SandboxedGrades._grader

    def _grade_student(self, nb, chapter, resources) -> dict:
        """Every chapter notebook this student submitted, graded at once as `batch` grades a
        student (one warm sandbox, the chapters one after another, the student's time budget):
        this notebook as nbgrader sanitized it, the others sanitized the same way here (a
        notebook that cannot be is graded on its own when nbgrader reaches it)."""
        from ..batch.workers import grade_student
        from ..references.cache import REFERENCES
        from ..references.store import persisted
        from ..settings import installed

        grader = self._grader_once()
        with installed(grader.settings), tempfile.TemporaryDirectory(prefix="nbgrader-") as tmp:
            folder = Path(tmp)
            nbformat.write(nb, folder / f"{chapter.id}.ipynb")
            for other_id, other in self._siblings(chapter, resources):
                nbformat.write(other, folder / f"{other_id}.ipynb")
            _, todo = grader.plan(folder)
            with persisted(REFERENCES, grader.seed, grader.quick, cuda="cuda" in grader.devices):
                chapters = grade_student(grader, todo)  # (batch's own: its zygote, the student's budget)
        return {ch.chapter: ch for ch in chapters}

    def _siblings(self, chapter, resources):
        """(chapter id, sanitized notebook) of the student's other submitted notebooks that the
        assignment has (nbgrader's own sanitize steps: cleared outputs, grade cells restored)."""
        import copy

        from nbgrader.converters.autograde import Autograde
        from nbgrader.coursedir import CourseDirectory

        info = resources["nbgrader"]
        try:
            coursedir = CourseDirectory(config=self.config)
            submitted = Path(coursedir.format_path(coursedir.submitted_directory, info["student"], info["assignment"]))
            source = Path(coursedir.format_path(coursedir.source_directory, ".", info["assignment"]))
            steps = self.config.Autograde.get("sanitize_preprocessors") or \
                Autograde.class_traits()["sanitize_preprocessors"].default()
        except Exception as e:
            self.log.warning("grading %s alone: %s", chapter.id, e)
            return
        for path in sorted(submitted.glob("*.ipynb")):
            other = chapter_for_filename(path.name)
            if other is None or other.id == chapter.id or path.stem != other.id or not (source / path.name).is_file():
                continue
            try:
                other_nb = nbformat.read(path, as_version=4)
                res = copy.deepcopy(resources)
                res["nbgrader"]["notebook"] = path.stem
                res["unique_key"] = path.stem
                for step in steps:
                    other_nb, res = step(parent=self)(other_nb, res)
            except Exception as e:  # (nbgrader grades it on its own, and says what is wrong)
                self.log.warning("%s: graded on its own (%s: %s)", path.name, type(e).__name__, e)
                continue
            yield other.id, other_nb


def _grade_outputs(tests, exercise: str | None, max_points: float, notes: list[str]) -> list:
    """A grade cell's outputs: the diagnosis, then the points (nbgrader's partial credit, which
    it reads from the cell's one execute_result). A grade cell the grader has no exercise for
    scores zero, with the reason on stderr (where nbgrader gives zero)."""
    from ..report.text import exercise_lines
    from ..report.untrusted_text import printable

    if not tests:
        why = (f"the grader has no exercise {exercise!r} in this chapter" if exercise
               else "this grade cell does not call check(...) for an exercise of this chapter")
        return [nbformat.v4.new_output("stream", name="stderr", text=f"not graded: {why}\n")]
    points = min(max(sum(t.exact_score for t in tests), 0.0), max_points)
    text = "\n".join([*(f"note: {n}" for n in notes), *exercise_lines(tests)])
    return [nbformat.v4.new_output("stream", name="stdout", text=printable(text) + "\n"),
            nbformat.v4.new_output("execute_result", data={"text/plain": repr(round(points, 4))},
                                   execution_count=None)]


def _generate_preprocessors() -> list:
    """nbgrader's generate_assignment steps, with ClearSolutionsAndAnswers where ClearSolutions was."""
    from nbgrader.converters.generate_assignment import GenerateAssignment
    from nbgrader.preprocessors import ClearSolutions

    from .answer_stubs import ClearSolutionsAndAnswers

    steps = GenerateAssignment.class_traits()["preprocessors"].default()
    if ClearSolutions not in steps:
        raise RuntimeError(f"nbgrader's generate_assignment steps have no ClearSolutions step to replace: {steps}")
    return [ClearSolutionsAndAnswers if step is ClearSolutions else step for step in steps]


GENERATE_PREPROCESSORS = _generate_preprocessors()


def _autograde_preprocessors() -> list:
    """nbgrader's own autograde steps, with SandboxedGrades where Execute was."""
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute

    steps = Autograde.class_traits()["autograde_preprocessors"].default()
    if Execute not in steps:  # (an nbgrader whose steps we do not know: grade nothing rather than forgeably)
        raise RuntimeError(f"nbgrader's autograde steps have no Execute step to replace: {steps}")
    return [SandboxedGrades if step is Execute else step for step in steps]


AUTOGRADE_PREPROCESSORS = _autograde_preprocessors()


def source_notebook(chapter: str):
    """The solution notebook with its self-check cells turned into grade cells."""
    nb = nbformat.read(solutions_dir() / f"{chapter}.ipynb", as_version=4)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade"):
            m = CHECK_CALL.search(cell.source)
            if not m:
                raise ValueError(f"{chapter}: grade cell {meta.get('grade_id')} has no check(...) call")
            cell.source = GRADE_CELL.format(**m.groupdict())
            meta["points"] = CHAPTERS[chapter].exercise(m["exercise"]).points
    return nb


def make_course(course_dir, assignment: str = "attention", chapters=None) -> Path:
    """Write an nbgrader course folder: config plus source/<assignment>/NN_name.ipynb."""
    course = Path(course_dir).resolve()
    src = course / "source" / assignment
    src.mkdir(parents=True, exist_ok=True)
    from ..cases.inputs import new_seed

    config = course / "nbgrader_config.py"
    if not config.exists():  # (the seed is made once per course: a second call keeps it)
        config.write_text(CONFIG.replace("__SEED__", str(new_seed())))
        config.chmod(0o600)
    for chapter in chapters or CHAPTERS:
        nbformat.write(source_notebook(chapter), src / f"{chapter}.ipynb")
    return course


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.integrations.nbgrader",
                                description="Write an nbgrader course folder from the solution notebooks.")
    p.add_argument("course_dir", type=Path)
    p.add_argument("--assignment", default="attention")
    args = p.parse_args(argv)
    course = make_course(args.course_dir, args.assignment)
    print(f"wrote {course} (source/{args.assignment}/); next: cd {course} && "
          f"nbgrader generate_assignment {args.assignment}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
