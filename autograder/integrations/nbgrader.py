"""nbgrader: a course source folder built from the solutions, and the hidden test each grade cell runs.

`make_course(course_dir)` writes an nbgrader course (nbgrader_config.py and
source/<assignment>/NN_name.ipynb). Each self-check cell of the solutions becomes an nbgrader
grade cell whose visible part is the student's self-check (printing, not raising) and whose
hidden part calls `score(...)`: our own grader run in the kernel on the same cases, returning
the exercise's points as nbgrader partial credit. So `nbgrader autograde` and
`python -m autograder grade` give the same scores.

    python -m autograder.integrations.nbgrader COURSE_DIR [--assignment attention]
    cd COURSE_DIR && nbgrader generate_assignment attention && ... && nbgrader autograde attention
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import warnings
from pathlib import Path

import nbformat

from ..contract import CHAPTERS
from ..references import solutions_dir

CHECK_CALL = re.compile(r'check\(\s*"(?P<chapter>[^"]+)"\s*,\s*"(?P<exercise>[^"]+)"\s*,\s*(?P<obj>[^)]+)\)')

GRADE_CELL = '''from autograder.selfcheck import check
check("{chapter}", "{exercise}", {obj}, raise_on_failure=False)
### BEGIN HIDDEN TESTS
from autograder.integrations.nbgrader import score
score("{chapter}", "{exercise}", globals())
### END HIDDEN TESTS'''

CONFIG = '''c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = "attention-course"
c.ExecutePreprocessor.timeout = 120
'''


def score(chapter: str, exercise: str, namespace: dict) -> float:
    """Grade one exercise of the objects in `namespace` (nbgrader's kernel) and return its points.

    Prints the diagnosis on stdout; never raises and never writes to stderr (nbgrader gives
    zero to a grade cell that writes to stderr)."""
    from ..grading import Grader
    from ..report.text import exercise_lines

    out = io.StringIO()
    points = 0.0
    with contextlib.redirect_stderr(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tests = Grader().grade_namespace(CHAPTERS[chapter], namespace, exercises=[exercise])
            points = sum(t.score for t in tests)
            print("\n".join(exercise_lines(tests)))
        except Exception as e:  # a broken namespace scores zero, with the reason
            print(f"could not grade {exercise}: {type(e).__name__}: {e}")
    noise = out.getvalue()
    if noise:
        print(noise[-2000:])
    max_points = CHAPTERS[chapter].exercise(exercise).points
    return round(min(max(points, 0.0), max_points), 4)


def source_notebook(chapter: str):
    """The solution notebook with its self-check cells turned into hidden-test grade cells."""
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
    (course / "nbgrader_config.py").write_text(CONFIG.format(root=str(course)))
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
