"""The command line: a thin layer that wires the grader, the batch runner and the reports."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .shared.contract import CHAPTER_IDS


def _chapters(text: str | None) -> list[str] | None:
    if not text:
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        match = [c for c in CHAPTER_IDS if c == part or c.startswith(part + "_") or c[:2] == part]
        if len(match) != 1:
            raise argparse.ArgumentTypeError(f"unknown chapter {part!r} (one of {', '.join(CHAPTER_IDS)})")
        out.append(match[0])
    return out


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: CPU, plus CUDA when available (else the device check: as if on a GPU, without values); "
                        "cpu: CPU and the device check; cuda: require a GPU (default: auto)")
    p.add_argument("--chapters", type=_chapters, default=None, metavar="LIST",
                   help="comma-separated chapters to grade, e.g. 02,03 (missing notebooks score zero); "
                        "default: the chapters found")
    p.add_argument("--sandbox", choices=["auto", "bubblewrap", "container", "none"], default=None,
                   help="how student code is isolated (default: $AUTOGRADER_SANDBOX or auto: bubblewrap, "
                        "else, as root in a container without namespaces, a uid per student)")
    p.add_argument("--seed", type=int, default=None,
                   help="the course's secret input seed (default: $AUTOGRADER_SEED; `grade` alone falls back to "
                        "the public built-in one, `batch` refuses to: see `new-seed`)")


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected student folder names, e.g. alice,bob")
    return names


def _shard(text: str) -> tuple[int, int]:
    from .batch.grade_class import parse_shard

    try:
        return parse_shard(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected K/N with 1 <= K <= N, e.g. 3/8") from None


class _HelpLimits(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        from .sandbox.limits import limits_table

        print(limits_table())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autograder",
        description="Grade attention-course notebooks against the reference solutions.")
    parser.add_argument("--help-limits", action=_HelpLimits, nargs=0,
                        help="print every limit on student code (AUTOGRADER_* variables, defaults) and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_grading_commands(sub)
    _add_class_commands(sub)
    _add_other_commands(sub)
    return parser


def _add_grading_commands(sub) -> None:
    """grade (one submission) and batch (a class)."""
    g = sub.add_parser("grade", help="grade one submission (a chapter notebook or a folder of them)",
                       description="Grade a chapter notebook, or a folder of them, and print a report.")
    g.add_argument("path", type=Path, help="a chapter notebook (NN_name.ipynb) or a folder")
    g.add_argument("--json", type=Path, metavar="FILE", help="write Gradescope results.json here")
    g.add_argument("--html", type=Path, metavar="FILE", help="write an HTML feedback page here")
    g.add_argument("--jobs", type=_positive, default=None, help="chapters graded at once (default: 2)")
    g.add_argument("--verbose", action="store_true", help="also show sandbox notes")
    _common(g)

    b = sub.add_parser("batch", help="grade a class: one sub-folder per student",
                       description="Grade every student folder in CLASS_DIR; write a grades CSV and, "
                                   "with --out, a results.json and feedback.html per student and the class "
                                   "report (class_report.html).")
    b.add_argument("class_dir", type=Path)
    b.add_argument("--csv", type=Path, default=Path("grades.csv"), help="grades CSV (default: grades.csv)")
    b.add_argument("--out", type=Path, default=None, help="folder for per-student reports")
    b.add_argument("--jobs", type=_positive, default=1,
                   help="students graded at once, one per worker process; set it to the number of CPU cores "
                        "(default: 1)")
    b.add_argument("--no-progress", action="store_true",
                   help="hide the progress bar (for a log file; the other messages stay)")
    b.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                   help="grade shard K of N of the class (a deterministic share, by a hash of each student "
                        "folder's name; the chapters come from the whole class): one task of a SLURM array "
                        "or a Kubernetes indexed Job. Join the shards with `merge`.")
    b.add_argument("--only", type=_names, default=None, metavar="NAMES",
                   help="regrade these student folders only (comma-separated), out of the class's chapters: "
                        "their rows replace theirs in the existing --csv, and with --out the class report is "
                        "rebuilt from every student's saved results there")
    _common(b)


def _add_class_commands(sub) -> None:
    """What comes after batch: merge (the shards of a class) and export (to an LMS)."""
    m = sub.add_parser("merge", help="join the CSVs (and report folders) of a class graded in shards",
                       description="Join the grades CSVs that `batch --shard K/N` wrote into one, as one "
                                   "batch of the whole class would have written it; with --reports, copy "
                                   "the shards' per-student report folders into --out.")
    m.add_argument("csvs", type=Path, nargs="+", metavar="SHARD_CSV")
    m.add_argument("--csv", type=Path, required=True, help="the merged grades CSV to write")
    m.add_argument("--reports", type=Path, nargs="*", default=[], metavar="SHARD_OUT",
                   help="the shards' --out folders")
    m.add_argument("--out", type=Path, default=None,
                   help="folder for the merged per-student reports and the class report")

    x = sub.add_parser("export", help="write the gradebook file an LMS imports (Canvas, Moodle) from `batch --out`",
                       description="Write the grades of a class graded with `batch --out DIR` in the layout an LMS "
                                   "imports as it is: canvas (Canvas's gradebook import), moodle (the assignment's "
                                   "grading worksheet where the class came from a Moodle download, else Moodle's "
                                   "gradebook CSV import by email or ID number) or plain (the grades CSV).")
    x.add_argument("out_dir", type=Path, metavar="DIR", help="the --out folder of `batch`")
    x.add_argument("--lms", choices=["canvas", "moodle", "plain"], required=True)
    x.add_argument("--columns", choices=["total", "chapters", "exercises"], default=None,
                   help="the grade columns (canvas, moodle): one total (default), one per chapter or one per "
                        "exercise; each is an assignment (Canvas) or grade item (Moodle) of that name")
    x.add_argument("--name", default=None, metavar="NAME",
                   help="the assignment's name in the LMS, the grade columns' prefix (default: "
                        "'Attention course autograder'); Canvas matches an existing assignment by 'Name (id)'")
    x.add_argument("--csv", type=Path, default=None, metavar="FILE", help="where to write it (default: DIR/<lms>.csv)")


def _add_other_commands(sub) -> None:
    """gradescope-zip, selfcheck-data, new-seed and import."""
    z = sub.add_parser("gradescope-zip", help="write the Gradescope autograder zip",
                       description="Write autograder.zip (setup.sh, run_autograder, the grader and the "
                                   "reference solutions) for a Gradescope programming assignment.")
    z.add_argument("output", type=Path, nargs="?", default=Path("autograder.zip"))
    z.add_argument("--chapters", type=_chapters, default=None, metavar="LIST",
                   help="chapters the assignment grades (default: all; a chapter not handed in scores zero)")
    z.add_argument("--hide-answers", action="store_true",
                   help="show the written answers' results (and so the total) only when the grades are "
                        "published (Gradescope's after_published)")
    z.add_argument("--seed", type=int, default=None,
                   help="the course's secret input seed (default: $AUTOGRADER_SEED, else a new random one, "
                        "stored in the zip)")

    sub.add_parser("selfcheck-data", help="rebuild the self-check fixtures from the reference solutions")
    sub.add_parser("new-seed", help="print a fresh random course seed (for --seed / $AUTOGRADER_SEED)")

    from .lms import submissions as lms_import  # (light: the standard library and the contract, no torch)
    i = sub.add_parser("import", help="import a Canvas, Moodle or Gradescope submissions download (one folder "
                                      "per student, for batch)",
                       description=lms_import.build_parser().description, epilog=lms_import.build_parser().epilog)
    lms_import.add_arguments(i)  # SOURCE DEST [--lms auto|canvas|moodle|gradescope] [--force] [--dry-run]


def main(argv: list[str] | None = None) -> int:
    """The command line. The settings (`settings.Settings`: AUTOGRADER_* variables) are read
    here, once, and handed down; they are also `settings.current()` while the command runs."""
    from .settings import Settings, installed

    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    other = {"selfcheck-data": _selfcheck_data, "new-seed": _new_seed, "import": _import,
             "merge": _merge, "export": _export, "gradescope-zip": _gradescope_zip}.get(args.command)
    from .report.atomic import WriteFailed

    with installed(settings):
        try:
            if other is not None:
                return other(args, settings)
            return _grade_or_batch(args, settings)
        except KeyboardInterrupt as e:  # (its sandboxes closed and temporary folders removed on the way)
            from .session.child_slot import stop_children

            stop_children()  # (the command ends: children without a sandbox too, none started after)
            return _interrupted(args, e)
        except WriteFailed as e:  # a file the command writes: the disk full, no permission
            print(f"error: {e.filename}: {e.strerror}{_kept(args)}", file=sys.stderr)
            return WRITE_FAILED


WRITE_FAILED = 5  # the exit status of a command that could not write a file


def _interrupted(args, stop: KeyboardInterrupt) -> int:
    """Ctrl-C, or the SIGTERM or SIGHUP that `__main__.stop_as_ctrl_c` turns into one: what was
    kept, instead of a traceback; the shell's status for that signal."""
    import signal

    name = str(stop) if str(stop) in ("SIGTERM", "SIGHUP") else "SIGINT"
    kept = ": nothing was written" if args.command == "grade" else _kept(args)
    print(f"interrupted ({name}){kept}", file=sys.stderr)
    return 128 + signal.Signals[name].value


def _kept(args) -> str:
    """What a batch that stopped half-way kept: its journal (`batch.journal`), if it has one."""
    if args.command != "batch" or args.only:
        return ""
    from .batch.journal import graded_students, journal_path
    from .report.text import plural

    kept = journal_path(args.csv)
    graded = graded_students(kept)
    if graded is None:
        return ""
    return f"; {plural(graded, 'student')} graded so far, kept in {kept}: the same command goes on from there"


def _selfcheck_data(args, settings) -> int:
    from .cases.selfcheck_data import DATA, write_fixtures
    write_fixtures()
    print(f"wrote {DATA}")
    return 0


def _new_seed(args, settings) -> int:
    from .cases.inputs import new_seed
    print(new_seed())
    return 0


def _import(args, settings) -> int:
    from .lms.submissions import run
    return run(args, settings)


def _merge(args, settings) -> int:
    from .batch.grades_csv import merge_csvs, merge_reports
    from .report.text import plural
    try:
        n = merge_csvs(args.csvs, args.csv)
        if args.reports:
            if args.out is None:
                print("error: --reports needs --out", file=sys.stderr)
                return 2
            merge_reports(args.reports, args.out)
            from .report import class_report
            print(f"wrote the class report {class_report.write(args.out)}")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.csv} ({plural(n, 'student')} from {plural(len(args.csvs), 'shard')})")
    return 0


def _export(args, settings) -> int:
    from .lms import export as lms_export
    path = args.csv or args.out_dir / f"{args.lms}.csv"
    try:
        written, tell = lms_export.export(args.out_dir, args.lms, path, args.columns,
                                          args.name or lms_export.DEFAULT_NAME)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in tell:
        print(f"note: {line}", file=sys.stderr)
    print(f"wrote {written}")
    return 0


def _gradescope_zip(args, settings) -> int:
    from .integrations.gradescope import build_zip
    build_zip(args.output, chapters=args.chapters, seed=args.seed, hide_answers=args.hide_answers,
              settings=settings)
    print(f"wrote {args.output}")
    return 0


def _grade_or_batch(args, settings) -> int:
    if args.command == "batch":  # (every student is graded in a worker process, under a watchdog)
        from .batch import forkserver
        from .sandbox import scratch
        scratch.claim_spool()  # (first: it lists this process's folders, and removes killed batches')
        forkserver.context()  # its imports run while this process imports torch below
    from .sandbox.modes import SandboxUnavailable, resolve_sandbox
    try:
        # (in the container mode, what a student's uid must not read: the class and its reports)
        hide = [p for p in (getattr(args, "class_dir", None), getattr(args, "out", None)) if p]
        sandbox = resolve_sandbox(args.sandbox or settings.sandbox, hide)  # decided once, handed down
    except SandboxUnavailable as e:
        print(f"error: no grading without the sandbox: {e}", file=sys.stderr)
        return 3
    if sandbox.mode != "bubblewrap":
        print(f"WARNING: {sandbox.note}", file=sys.stderr)
    elif args.command == "batch":  # (its torch import, too, runs while this process imports torch)
        from .batch import first_zygote
        first_zygote.start(settings.limits)
    sandboxes = _prestarted_sandboxes(args, sandbox, settings) if args.command == "grade" else None
    from .grading.grader import Grader
    from .cases.inputs import PublicSeed, course_seed
    try:
        seed = course_seed(args.seed, settings) if args.command == "batch" else args.seed
        grader = Grader(device=args.device, seed=seed, sandbox=sandbox, settings=settings)
    except PublicSeed as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from .references.cache import REFERENCES
    from .references.store import persisted
    with persisted(REFERENCES, grader.seed, grader.quick, cuda="cuda" in grader.devices):
        return _run(args, grader, sandboxes, REFERENCES)


def _prestarted_sandboxes(args, sandbox, settings):
    """The student's warm sandboxes (None in the fallback mode), started now: their torch imports
    overlap this process's. This command owns them and closes them after grading."""
    import atexit
    import os

    from .sandbox.pool import student_pool

    jobs = 1 if args.path.is_file() else args.jobs or min(2, os.cpu_count() or 1)
    sandboxes = student_pool(sandbox, settings.limits, size=jobs)
    if sandboxes is not None:
        atexit.register(sandboxes.close)
        sandboxes.prestart()
    return sandboxes


def _run(args, grader, sandboxes, references) -> int:
    """The grade and batch commands, with the reference outcomes of earlier runs loaded."""
    if args.command == "grade":
        return _grade(args, grader, sandboxes, references)
    return _batch(args, grader)


def _grade(args, grader, sandboxes, references) -> int:
    from .shared.contract import CHAPTERS
    if sandboxes is not None and "cuda" not in grader.devices and \
            not references.complete(args.chapters or list(CHAPTERS), grader.devices,
                                    grader.seed, grader.quick):
        # The device check's references need torch's symbolic shapes (sympy, 0.3 s): import
        # them while this process waits for the student's sandbox to be ready.
        import importlib
        import threading

        def preload():
            importlib.import_module("torch.fx.experimental.symbolic_shapes")
        threading.Thread(target=preload, daemon=True).start()
    from .report import gradescope, html, text
    if not args.path.exists():
        print(f"error: {args.path}: no such file or folder", file=sys.stderr)
        return 2
    try:
        result = grader.grade_path(args.path, chapters=args.chapters, jobs=args.jobs,
                                   sandboxes=sandboxes)
    finally:
        if sandboxes is not None:
            sandboxes.close()
    print(text.render(result, verbose=args.verbose))
    if args.json:
        gradescope.write(result, args.json)
    if args.html:
        html.write(result, args.html)
    return 0


def _batch(args, grader) -> int:
    from .batch.grade_class import grade_class
    if not args.class_dir.is_dir():
        print(f"error: {args.class_dir}: not a folder", file=sys.stderr)
        return 2
    from .report.text import plural
    from .report.untrusted_text import printable
    try:
        results = grade_class(args.class_dir, grader, jobs=args.jobs, out_dir=args.out, csv_path=args.csv,
                              chapters=args.chapters, progress=not args.no_progress, shard=args.shard,
                              only=args.only)
    except ValueError as e:  # (--only: a name that is no student folder, a CSV of other columns)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not any(ch.notebook for r in results.values() for ch in r.chapters):  # (nothing was written)
        print(f"error: nothing gradable in {args.class_dir}: no student folder holds a chapter notebook "
              "(an LMS download? `python -m autograder import` makes one folder per student); "
              f"{args.csv} was not written", file=sys.stderr)
        return 2
    print(f"{'updated' if args.only else 'wrote'} {args.csv} ({plural(len(results), 'student')})")
    failed = sorted(name for name, r in results.items() if r.error)
    if failed:
        print(f"error: grading could not finish for {plural(len(failed), 'student')}: {', '.join(printable(f) for f in failed[:10])} "
              "(`error` in the CSV; grade them again)", file=sys.stderr)
        return 4
    return 0
