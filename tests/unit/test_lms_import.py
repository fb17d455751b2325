"""Importing LMS submission exports (autograder/lms/submissions.py): Canvas's flat download, Moodle's
zip of folders, Gradescope's export with submission_metadata.yml; duplicates, students' own zips,
files that cannot be placed, re-encoding; and one class imported from Canvas graded by `batch`.

The fixtures are built here from the repository's notebooks, named as each LMS names its files."""
import codecs
import csv
import io
import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

from autograder.lms import layouts
from autograder.lms.uploads import DestinationExists, LmsImportError, to_utf8
from autograder.lms.placing import chapter_of
from autograder.lms.submissions import import_submissions, main
from autograder.lms.layouts import parse_gradescope_metadata

from grading_helpers import REPO

CH4, CH5 = "04_positional_encoding", "05_masks"


def notebook(chapter: str, kind: str = "solutions") -> bytes:
    return (REPO / kind / f"{chapter}.ipynb").read_bytes()


SOLUTION, STUB = notebook(CH5), notebook(CH5, "exercises")
UTF16 = codecs.BOM_UTF16_LE + SOLUTION.decode("utf-8").encode("utf-16-le")


def make_zip(files: dict, empty_dirs=(), times: dict | None = None) -> bytes:
    """A zip of {member name: bytes}, with folder entries for `empty_dirs` and, for names in
    `times`, that (y, m, d, H, M, S) as the member's time."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for d in empty_dirs:
            z.writestr(zipfile.ZipInfo(d.rstrip("/") + "/"), b"")
        for name, data in files.items():
            info = zipfile.ZipInfo(name, (times or {}).get(name, (2024, 3, 1, 12, 0, 0)))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()


def write_files(folder, files: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def unplaced(report) -> dict:
    """source -> reason."""
    return {u.source: u.reason for u in report.unplaced}


# -- Canvas ----------------------------------------------------------------------------------------
def canvas_download(folder):
    """A flat Canvas "Download Submissions" folder: <lastfirst>[_LATE]_<user id>_<submission id>_<name>."""
    write_files(folder, {
        "smitherin_1001_5001_05_masks.ipynb": SOLUTION,
        "jonesbob_LATE_1002_5002_05_Masks.ipynb": STUB,
        # a re-submission: Canvas numbers the second upload of one file name -1, the third -2
        "leeann_1003_5010_05_masks-1.ipynb": STUB,
        "leeann_1003_5020_05_masks-2.ipynb": SOLUTION,
        # the example: case, and Canvas's numbering after the chapter's name
        "smithErin_1234_5678_04_Positional_Encoding-2.ipynb": notebook(CH4),
        "kimdan_1004_5030_report.pdf": b"%PDF-1.4 not a notebook",
        "kimdan_1004_5031_homework.ipynb": STUB,
        # the student's own zip, with Jupyter's checkpoint folder inside
        "parkjo_1005_5040_work.zip": make_zip({"work/05_masks.ipynb": SOLUTION,
                                               "work/.ipynb_checkpoints/05_masks-checkpoint.ipynb": STUB,
                                               "__MACOSX/work/._05_masks.ipynb": b"junk",
                                               "work/.git/config": b"[core]", "work/.git/HEAD": b"ref"}),
        "wuli_1006_5050_05_masks.ipynb": UTF16,
        "ngovan_1007_5060_submission.zip": b"PK\x03\x04 this zip is damaged",
        "notes from the TA.txt": b"whose?",
        "smitherin_1001_text.html": b"<p>online text</p>",  # (no submission id: a known student's)
        "notes_2024_week1.txt": b"no one's",
        ".DS_Store": b"junk",
    })


def test_a_flat_canvas_download_gives_a_folder_per_student(tmp_path):
    canvas_download(tmp_path / "export")
    report = import_submissions(tmp_path / "export", tmp_path / "class")
    assert report.lms == "canvas" and report.written
    assert sorted(report.students) == ["jonesbob_1002", "kimdan_1004", "leeann_1003", "ngovan_1007",
                                       "parkjo_1005", "smithErin_1234", "smitherin_1001", "wuli_1006"]
    cls = tmp_path / "class"
    # every notebook renamed to its chapter, in its student's folder
    assert (cls / "smitherin_1001" / f"{CH5}.ipynb").read_bytes() == SOLUTION
    assert (cls / "jonesbob_1002" / f"{CH5}.ipynb").read_bytes() == STUB
    assert (cls / "smithErin_1234" / f"{CH4}.ipynb").read_bytes() == notebook(CH4)
    assert report.student("1234").placed[CH4].source == "smithErin_1234_5678_04_Positional_Encoding-2.ipynb"
    assert report.student("1002").notes == ["LATE: Canvas marked the submission late"]
    assert report.student("1002").id_kind == "Canvas user id"

    # the re-submission pair: the later one, and the output says why
    assert (cls / "leeann_1003" / f"{CH5}.ipynb").read_bytes() == SOLUTION
    [choice] = report.student("1003").choices
    assert choice.chosen == "leeann_1003_5020_05_masks-2.ipynb"
    assert choice.others == ["leeann_1003_5010_05_masks-1.ipynb"]
    assert choice.reason == "the later Canvas submission id: 5020 > 5010"

    # the student's zip, unpacked; its checkpoint is not the notebook
    assert (cls / "parkjo_1005" / f"{CH5}.ipynb").read_bytes() == SOLUTION
    assert report.student("1005").placed[CH5].source == "parkjo_1005_5040_work.zip/work/05_masks.ipynb"

    # UTF-16 with a BOM: placed, as UTF-8
    placed = report.student("1006").placed[CH5]
    assert placed.notes == ["re-encoded from UTF-16 (LE, with BOM) to UTF-8"]
    assert json.loads((cls / "wuli_1006" / f"{CH5}.ipynb").read_text("utf-8")) == json.loads(SOLUTION)

    # what could not be placed, each with its reason (and whose it is)
    skipped = unplaced(report)
    assert "PDF" in skipped["kimdan_1004_5030_report.pdf"]
    assert "names no chapter" in skipped["kimdan_1004_5031_homework.ipynb"]
    assert "damaged zip" in skipped["ngovan_1007_5060_submission.zip"]
    assert "not named like a Canvas download" in skipped["notes from the TA.txt"]
    assert "not named like a Canvas download" in skipped["notes_2024_week1.txt"]
    assert "HTML" in skipped["smitherin_1001_text.html"]
    assert "checkpoints" in skipped["parkjo_1005_5040_work.zip/work/.ipynb_checkpoints"]
    assert "hidden folder" in skipped["parkjo_1005_5040_work.zip/work/.git"]
    assert not any("DS_Store" in s or "MACOSX" in s for s in skipped)  # (system files: not listed)
    by = {u.source: u.student for u in report.unplaced}
    assert by["kimdan_1004_5030_report.pdf"] == "kimdan_1004" and by["notes from the TA.txt"] is None
    # a student with nothing gradable still gets a folder (batch scores it zero), and a note
    assert (cls / "kimdan_1004").is_dir() and not list((cls / "kimdan_1004").iterdir())
    assert report.student("1004").placed == {}

    # students.csv: the folder (batch's `student`) with the LMS's id for the student
    rows = {r["student"]: r for r in csv.DictReader(open(cls / "students.csv"))}
    assert set(rows) == set(report.students)
    assert rows["jonesbob_1002"] == {"student": "jonesbob_1002", "lms": "canvas", "id_kind": "Canvas user id",
                                         "lms_id": "1002", "name": "jonesbob", "email": "",
                                         "notes": "LATE: Canvas marked the submission late"}
    summary = (cls / "import_report.txt").read_text()
    assert "kimdan_1004  1004  kimdan: no gradable notebook (an empty folder: batch scores it zero)" in summary
    assert "chose leeann_1003_5020_05_masks-2.ipynb over leeann_1003_5010_05_masks-1.ipynb" in summary
    assert "kimdan_1004_5030_report.pdf [kimdan_1004]: a PDF" in summary


def test_a_canvas_zip_and_an_existing_class_folder(tmp_path, capsys):
    """The download as Canvas hands it over (submissions.zip); a second import into the same
    class folder refuses, and writes nothing, unless --force."""
    files = {"smitherin_1001_5001_05_masks.ipynb": SOLUTION, "jonesbob_1002_5002_05_masks.ipynb": STUB}
    (tmp_path / "submissions.zip").write_bytes(make_zip(files))
    cls = tmp_path / "class"
    assert main([str(tmp_path / "submissions.zip"), str(cls)]) == 0
    out = capsys.readouterr().out
    assert "Imported a Canvas export" in out and "2 students, 2 notebooks placed, 0 items not placed" in out
    (cls / "smitherin_1001" / "mine.txt").write_text("the instructor's")
    with pytest.raises(DestinationExists, match="--force"):
        import_submissions(tmp_path / "submissions.zip", cls)
    assert main([str(tmp_path / "submissions.zip"), str(cls)]) == 2
    assert "already has folders of 2 students" in capsys.readouterr().err
    assert (cls / "smitherin_1001" / "mine.txt").exists()
    assert main([str(tmp_path / "submissions.zip"), str(cls), "--dry-run"]) == 0
    assert "DEST already has (an import needs --force): jonesbob_1002, smitherin_1001" in capsys.readouterr().out
    assert main([str(tmp_path / "submissions.zip"), str(cls), "--force"]) == 0
    assert "replaced: jonesbob_1002, smitherin_1001" in capsys.readouterr().out
    assert not (cls / "smitherin_1001" / "mine.txt").exists()
    assert (cls / "smitherin_1001" / f"{CH5}.ipynb").read_bytes() == SOLUTION


# -- Moodle ----------------------------------------------------------------------------------------
def moodle_zip() -> bytes:
    """Moodle's "Download all submissions": a folder per student and submission plugin."""
    times = {"Li Wu_48_assignsubmission_file_/05_masks.ipynb": (2024, 3, 1, 9, 0, 0),
             "Li Wu_48_assignsubmission_file_/05_masks_final.ipynb": (2024, 3, 2, 9, 0, 0)}
    return make_zip({
        "Erin Smith_42_assignsubmission_file_/05_masks.ipynb": SOLUTION,
        "Bob Jones_43_assignsubmission_onlinetext_/onlinetext.html": b"<p>I did it</p>",
        "Ann Lee_44_assignsubmission_file_/05_masks.ipynb": STUB,
        "Ann Lee_44_assignsubmission_file_/05_masks (1).ipynb": STUB,
        "Ann Lee_44_assignsubmission_file_/05_masks (2).ipynb": SOLUTION,
        "Dan Kim_45_assignsubmission_file_/lab.zip": make_zip({"lab/05_masks.ipynb": SOLUTION,
                                                               "lab/notes.pdf": b"%PDF"}),
        "José Núñez_46_assignsubmission_file_/04 Positional Encoding.ipynb": notebook(CH4),
        # without "Download submissions in folders": flat files
        "Jo Park_47_assignsubmission_file_05_masks.ipynb": SOLUTION,
        **{name: (STUB if name.endswith("/05_masks.ipynb") else SOLUTION) for name in times},
    }, empty_dirs=["Bob Jones_43_assignsubmission_file_/"], times=times)


def test_a_moodle_zip_gives_a_folder_per_student(tmp_path):
    (tmp_path / "moodle.zip").write_bytes(moodle_zip())
    report = import_submissions(tmp_path / "moodle.zip", tmp_path / "class")
    cls = tmp_path / "class"
    assert report.lms == "moodle"
    assert sorted(report.students) == ["Ann_Lee_44", "Bob_Jones_43", "Dan_Kim_45", "Erin_Smith_42",
                                       "Jo_Park_47", "Jose_Nunez_46", "Li_Wu_48"]
    assert report.student("42").name == "Erin Smith" and report.student("42").id_kind == "Moodle participant id"
    assert (cls / "Erin_Smith_42" / f"{CH5}.ipynb").read_bytes() == SOLUTION
    assert (cls / "Jo_Park_47" / f"{CH5}.ipynb").read_bytes() == SOLUTION
    assert (cls / "Jose_Nunez_46" / f"{CH4}.ipynb").read_bytes() == notebook(CH4)

    # x.ipynb, x (1).ipynb, x (2).ipynb (a browser's copies): the newest, (2)
    assert (cls / "Ann_Lee_44" / f"{CH5}.ipynb").read_bytes() == SOLUTION
    [choice] = report.student("44").choices
    assert choice.chosen == "Ann Lee_44_assignsubmission_file_/05_masks (2).ipynb"
    assert choice.reason == "the higher copy number: (2) over (1)"
    # two names for one chapter: by the files' times
    [choice] = report.student("48").choices
    assert choice.chosen.endswith("/05_masks_final.ipynb")
    assert choice.reason.startswith("the newer file time: 2024-03-02 09:00:00 > 2024-03-01 09:00:00")
    assert (cls / "Li_Wu_48" / f"{CH5}.ipynb").read_bytes() == SOLUTION

    # a zip the student handed in: unpacked; its PDF listed
    assert (cls / "Dan_Kim_45" / f"{CH5}.ipynb").read_bytes() == SOLUTION
    skipped = unplaced(report)
    assert "PDF" in skipped["Dan Kim_45_assignsubmission_file_/lab.zip/lab/notes.pdf"]
    # an empty folder and online text: listed, the student's folder empty
    assert "empty folder" in skipped["Bob Jones_43_assignsubmission_file_"]
    assert "HTML" in skipped["Bob Jones_43_assignsubmission_onlinetext_/onlinetext.html"]
    assert report.student("43").placed == {} and not list((cls / "Bob_Jones_43").iterdir())


# -- Gradescope ------------------------------------------------------------------------------------
METADATA = """\
---
:submission_9001:
  :submitters:
  - :name: Erin Smith
    :sid: '1234'
    :email: erin@example.edu
  :created_at: 2024-03-01 10:00:00.000000000 -08:00
  :score: 0.0
  :status: processed
  :results: !ruby/hash:ActiveSupport::HashWithIndifferentAccess
    tests: []
  :history: []
:submission_9003:
  :submitters:
  - :name: Erin Smith
    :sid: '1234'
    :email: erin@example.edu
  :created_at: 2024-03-02 10:00:00.000000000 -08:00
  :history:
  - :submission_9001:
      :score: 0.0
:submission_9002:
  :submitters:
  - :name: Bob Jones
    :sid: '22'
    :email: bob@example.edu
  - :name: "Ann O'Lee"
    :sid:
    :email: ann@example.edu
  :created_at: 2024-03-01 11:00:00.000000000 -08:00
:submission_9005:
  :submitters:
  - :name: Cy Twombly
    :sid: '55'
    :email: cy@example.edu
"""


def gradescope_zip() -> bytes:
    """Gradescope's "Export Submissions": assignment_<id>_export/ with submission_<id>/ folders."""
    top = "assignment_777_export/"
    return make_zip({
        top + "submission_metadata.yml": METADATA.encode(),
        top + "submission_9001/05_masks.ipynb": STUB,
        top + "submission_9003/05_masks.ipynb": SOLUTION,          # Erin's later submission
        top + "submission_9002/05_masks-1.ipynb": STUB,            # a group's, numbered copies
        top + "submission_9002/05_masks-2.ipynb": SOLUTION,
        top + "submission_9004/05_masks.ipynb": SOLUTION,          # in no one's metadata
    }, empty_dirs=[top + "submission_9005/"])


@pytest.mark.parametrize("yaml_reader", ["pyyaml", "builtin"])
def test_a_gradescope_export_gives_a_folder_per_student(tmp_path, monkeypatch, yaml_reader):
    if yaml_reader == "builtin":
        monkeypatch.setitem(sys.modules, "yaml", None)  # (the grader does not need PyYAML)
    else:
        pytest.importorskip("yaml")
        monkeypatch.setattr(layouts, "_mini_yaml", None)  # (PyYAML reads it all)
    (tmp_path / "export.zip").write_bytes(gradescope_zip())
    report = import_submissions(tmp_path / "export.zip", tmp_path / "class")
    cls = tmp_path / "class"
    assert report.lms == "gradescope"
    assert sorted(report.students) == ["Ann_O_Lee_ann_example_edu", "Bob_Jones_22", "Cy_Twombly_55",
                                       "Erin_Smith_1234"]
    erin = report.student("1234")
    assert (erin.name, erin.email, erin.id_kind) == ("Erin Smith", "erin@example.edu", "Gradescope SID")
    assert (cls / "Erin_Smith_1234" / f"{CH5}.ipynb").read_bytes() == SOLUTION
    [choice] = erin.choices
    assert choice.reason == "the later Gradescope submission id: 9003 > 9001"
    assert choice.chosen == "assignment_777_export/submission_9003/05_masks.ipynb"

    # a group submission: each submitter gets it; Canvas-style -N numbering decides between copies
    for folder in ("Bob_Jones_22", "Ann_O_Lee_ann_example_edu"):
        assert (cls / folder / f"{CH5}.ipynb").read_bytes() == SOLUTION
        assert report.students[folder].choices[0].reason == "the higher re-submission number: -2 over -1"
    ann = report.student("ann@example.edu")
    assert ann.id_kind == "Gradescope email" and ann.notes == ["group submission 9002 with Bob Jones"]

    skipped = unplaced(report)
    assert "not in submission_metadata.yml" in skipped["assignment_777_export/submission_9004"]
    assert "empty folder" in skipped["assignment_777_export/submission_9005"]
    assert report.student("55").placed == {}


def test_the_gradescope_metadata_reader_without_pyyaml(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    meta = parse_gradescope_metadata(METADATA.encode())
    assert sorted(meta) == ["submission_9001", "submission_9002", "submission_9003", "submission_9005"]
    assert meta["submission_9002"]["submitters"] == [
        {"name": "Bob Jones", "sid": "22", "email": "bob@example.edu"},
        {"name": "Ann O'Lee", "sid": "", "email": "ann@example.edu"}]
    assert meta["submission_9001"]["created_at"] == "2024-03-01 10:00:00.000000000 -08:00"
    # what else Ruby's YAML writes: block scalars, long plain scalars wrapped onto deeper lines
    more = parse_gradescope_metadata(b"""\
:submission_1:
  :results:
    output: |
      line one
      line two: still text
    tests:
    - name: a
      score: 1
  :submitters:
  - :name: Maria Jose de la Cruz Fernandez y Garcia de
      los Santos
    :sid: "77"
    :email: maria@example.edu
""")
    assert more == {"submission_1": {"created_at": "", "submitters": [
        {"name": "Maria Jose de la Cruz Fernandez y Garcia de los Santos", "sid": "77",
         "email": "maria@example.edu"}]}}


# -- names, encodings, nothing gradable ----------------------------------------------------------
@pytest.mark.parametrize("name, chapter", [
    ("05_masks.ipynb", CH5), ("05_Masks (2).ipynb", CH5), ("04_Positional_Encoding-2.ipynb", CH4),
    ("04 Positional Encoding.ipynb", CH4), ("05.ipynb", CH5), ("erin_masks copy.ipynb", CH5),
    ("Copy of 05_masks.ipynb", CH5), ("05_masks.ipynb.txt", CH5), ("homework.ipynb", None),
    ("attention.ipynb", None), ("2024_lab.ipynb", None),
])
def test_which_chapter_a_file_name_names(name, chapter):
    assert chapter_of(name) == chapter


def test_notebooks_not_in_utf8_are_re_encoded():
    text = '{"cells": [], "metadata": {"author": "Zoë"}}'
    assert to_utf8(text.encode()) == (text.encode(), None)
    assert to_utf8(codecs.BOM_UTF8 + text.encode()) == (codecs.BOM_UTF8 + text.encode(), None)
    for data, label in ((text.encode("utf-16"), "UTF-16 (LE, with BOM)"),
                        (codecs.BOM_UTF16_BE + text.encode("utf-16-be"), "UTF-16 (BE, with BOM)"),
                        (text.encode("utf-32"), "UTF-32 (LE, with BOM)"),
                        (text.encode("utf-16-le"), "UTF-16 (LE, no BOM)")):
        assert to_utf8(data) == (text.encode(), f"re-encoded from {label} to UTF-8")
    assert to_utf8(text.encode("cp1252")) == (text.encode(), "not UTF-8: re-encoded from Windows-1252 (a guess) "
                                                             "to UTF-8")


def test_nothing_gradable_exits_non_zero(tmp_path, capsys):
    write_files(tmp_path / "export", {"smitherin_1001_5001_essay.pdf": b"%PDF",
                                      "jonesbob_1002_5002_untitled.ipynb": STUB})
    assert main([str(tmp_path / "export"), str(tmp_path / "class")]) == 1
    out = capsys.readouterr().out
    assert "0 notebooks placed, 2 items not placed" in out and "error: no gradable notebook" in out
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "class2")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    write_files(tmp_path / "unknown", {"a.ipynb": STUB})
    with pytest.raises(LmsImportError, match="not recognised as a Canvas, Moodle or Gradescope export"):
        import_submissions(tmp_path / "unknown", tmp_path / "class3")
    (tmp_path / "broken.zip").write_bytes(b"PK\x03\x04 broken")
    assert main([str(tmp_path / "broken.zip"), str(tmp_path / "class4")]) == 2
    assert "not a readable zip" in capsys.readouterr().err


def test_a_dry_run_writes_nothing(tmp_path):
    canvas_download(tmp_path / "export")
    report = import_submissions(tmp_path / "export", tmp_path / "class", dry_run=True)
    assert report.placed_count == 6 and not report.written and not (tmp_path / "class").exists()
    assert report.summary().startswith("Would import a Canvas export")


def test_newest_by_file_time_in_a_flat_folder(tmp_path):
    """Moodle's flat layout, two names for one chapter: the file with the later time."""
    export = tmp_path / "export"
    write_files(export, {"Erin Smith_42_assignsubmission_file_05_masks.ipynb": SOLUTION,
                         "Erin Smith_42_assignsubmission_file_old_05_masks.ipynb": STUB})
    now = time.time()
    os.utime(export / "Erin Smith_42_assignsubmission_file_old_05_masks.ipynb", (now - 3600, now - 3600))
    (export / "Erin Smith_42_assignsubmission_file_01_intuition.ipynb").symlink_to(REPO / "solutions" /
                                                                                  "01_intuition.ipynb")
    report = import_submissions(export, tmp_path / "class", lms="moodle")
    assert "symbolic link" in unplaced(report)["Erin Smith_42_assignsubmission_file_01_intuition.ipynb"]
    [choice] = report.choices
    assert choice.chosen == "Erin Smith_42_assignsubmission_file_05_masks.ipynb"
    assert choice.reason.startswith("the newer file time")
    assert (tmp_path / "class" / "Erin_Smith_42" / f"{CH5}.ipynb").read_bytes() == SOLUTION


# -- end to end ------------------------------------------------------------------------------------
def test_an_imported_canvas_class_is_graded_by_batch(tmp_path):
    """`python -m autograder.lms.submissions` then `python -m autograder batch`: the newest of a
    re-submission pair and a UTF-16 notebook are graded (a solution scores 13/13)."""
    write_files(tmp_path / "export", {
        "leeann_1003_5010_05_masks-1.ipynb": STUB,
        "leeann_1003_5020_05_masks-2.ipynb": SOLUTION,
        "wuli_LATE_1006_5050_05_Masks.ipynb": UTF16,
        "jonesbob_1002_5002_05_masks.ipynb": STUB,
    })
    cls = tmp_path / "class"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "autograder", "import", str(tmp_path / "export"), str(cls)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "3 students, 3 notebooks placed" in run.stdout
    run = subprocess.run([sys.executable, "-m", "autograder", "batch", str(cls), "--chapters", "05", "--jobs", "1",
                          "--no-progress", "--csv", str(tmp_path / "grades.csv"), "--device", "cpu"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout + run.stderr
    from grading_helpers import read_gradebook
    rows = read_gradebook(tmp_path / "grades.csv")  # by the LMS's ids, which import wrote
    assert set(rows) == {"1003", "1006", "1002"}
    assert float(rows["1003"]["Total"]) == 13
    assert float(rows["1006"]["Total"]) == 13
    assert float(rows["1002"]["Total"]) < 13
    ids = {r["student"]: r["lms_id"] for r in csv.DictReader(open(cls / "students.csv"))}
    assert ids == {"leeann_1003": "1003", "wuli_1006": "1006", "jonesbob_1002": "1002"}
