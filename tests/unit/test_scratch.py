"""The ledger of a grading process's temporary folders (`sandbox.scratch`): what a killed batch
worker listed is removed when the batch ends, and nothing else is, whatever a ledger says."""
import os
import tempfile

from autograder.sandbox import scratch


def test_listed_folders_are_removed_and_nothing_else(tmp_path, monkeypatch):
    top = tmp_path / "tmp"
    top.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(top))
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(scratch, "_LEDGER", str(spool / "ledger-123"))
    made = scratch.mkdtemp("autograder-session-")
    (top / "autograder-session-x" / "deep").mkdir(parents=True)  # made, not listed
    (tmp_path / "autograder-elsewhere").mkdir()  # listed (a ledger is text), outside the folder
    (top / "mine").mkdir()  # listed, not the grader's name
    os.symlink(tmp_path / "autograder-elsewhere", top / "autograder-link")
    with open(spool / "ledger-123", "a") as f:
        f.write(f"{tmp_path / 'autograder-elsewhere'}\n{top / 'mine'}\n{top / 'autograder-link'}\n")
    (spool / "s0.json").write_text("{}")
    scratch.remove_listed(str(spool))
    assert not os.path.exists(made)
    assert sorted(os.listdir(top)) == ["autograder-link", "autograder-session-x", "mine"]
    assert (tmp_path / "autograder-elsewhere").is_dir()


def test_without_a_ledger_nothing_is_listed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_LEDGER", None)
    path = scratch.mkdtemp("autograder-runtime-")
    assert os.path.isdir(path) and os.listdir(tmp_path) == [os.path.basename(path)]
