"""autograder/settings.py: every AUTOGRADER_* variable is read in one place (`Settings.from_env`),
as the README documents it, once at an entry point; what lies below (the batch's workers above
all) gets the object, not the environment."""
import os
import re
from pathlib import Path

import pytest

from autograder import settings as settings_module
from autograder.settings import DEFAULT_UID_RANGE, REPO_DIR, Settings, current, installed, settings_table

README = REPO_DIR / "README.md"


def test_every_variable_is_read_as_the_readme_documents_it(tmp_path):
    s = Settings.from_env({
        "AUTOGRADER_SEED": " 123 ", "AUTOGRADER_ALLOW_PUBLIC_SEED": "1", "AUTOGRADER_SOLUTIONS": str(tmp_path),
        "AUTOGRADER_CACHE_DIR": str(tmp_path / "c"), "AUTOGRADER_HIDE": f"/a{os.pathsep}{os.pathsep}/b",
        "AUTOGRADER_SANDBOX": "None", "AUTOGRADER_UID_RANGE": "70000-70009", "AUTOGRADER_MEMORY": "2G",
        "AUTOGRADER_CELL_TIMEOUT": "3.5"})
    assert (s.seed, s.allow_public_seed, s.solutions, s.cache) == (123, True, tmp_path, tmp_path / "c")
    assert (s.hide, s.sandbox, s.uid_range) == (("/a", "/b"), "none", (70000, 70009))
    assert (s.limits.memory, s.limits.cell_timeout) == (2 << 30, 3.5)


def test_the_defaults(tmp_path):
    s = Settings.from_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert (s.seed, s.allow_public_seed, s.solutions) == (None, False, REPO_DIR / "solutions")
    assert s.cache == tmp_path / "attention-autograder"
    assert (s.hide, s.sandbox, s.uid_range) == ((), "auto", DEFAULT_UID_RANGE)
    assert Settings.from_env({"AUTOGRADER_CACHE_DIR": "off"}).cache is None
    assert Settings.from_env({"AUTOGRADER_ALLOW_PUBLIC_SEED": "yes"}).allow_public_seed is False
    assert Settings.from_env({"AUTOGRADER_UID_RANGE": "5-1"}).uid_range == DEFAULT_UID_RANGE
    with pytest.raises(ValueError, match="AUTOGRADER_SEED"):
        Settings.from_env({"AUTOGRADER_SEED": "abc"})


def test_the_readme_shows_the_settings_table():
    shown = re.search(r"<!-- settings: .*?-->\n(.*?)\n<!-- end of settings -->", README.read_text(), re.S)
    assert shown, "README.md has no generated settings table"
    assert shown.group(1) == settings_table()
    assert len(shown.group(1).splitlines()) == 2 + 8  # (every variable: the seven, and the limits')


def test_the_deep_helpers_read_the_installed_settings(tmp_path, monkeypatch):
    from autograder.cases.inputs import course_seed, grading_seed
    from autograder.references.solutions import solutions_dir
    from autograder.references.store import cache_dir
    from autograder.sandbox.policy import hidden_paths
    from autograder.sandbox.uids import uid_range

    mine = Settings.from_env({"AUTOGRADER_SEED": "99", "AUTOGRADER_SOLUTIONS": str(tmp_path / "sol"),
                              "AUTOGRADER_CACHE_DIR": str(tmp_path / "cache"),
                              "AUTOGRADER_HIDE": str(tmp_path / "secret"), "AUTOGRADER_UID_RANGE": "70000-70001"})
    monkeypatch.setenv("AUTOGRADER_SEED", "5")  # (the environment is not read again while installed)
    with installed(mine):
        assert current() is mine
        assert (grading_seed(), course_seed()) == (99, 99)
        assert (solutions_dir(), cache_dir(), uid_range()) == (tmp_path / "sol", tmp_path / "cache", (70000, 70001))
        hidden = hidden_paths()
        assert {str(tmp_path / "sol"), str(tmp_path / "cache"), str(tmp_path / "secret")} <= set(hidden)
    assert grading_seed() == 5  # (no entry point: the package as a library reads the environment now)
    assert settings_module._INSTALLED == []


def test_a_graded_deployment_refuses_the_public_seed_from_its_settings():
    from autograder.cases.inputs import DEFAULT_SEED, PublicSeed, course_seed

    for env in ({}, {"AUTOGRADER_SEED": str(DEFAULT_SEED)}):
        with pytest.raises(PublicSeed):
            course_seed(None, Settings.from_env(env))
    assert course_seed(None, Settings.from_env({"AUTOGRADER_SEED": "42"})) == 42
    assert course_seed(None, Settings.from_env({"AUTOGRADER_ALLOW_PUBLIC_SEED": "1"})) == DEFAULT_SEED


def test_the_command_line_refuses_a_variable_it_cannot_read(monkeypatch, capsys):
    from autograder.cli import main

    monkeypatch.setenv("AUTOGRADER_MEMORY", "lots")
    assert main(["new-seed"]) == 2
    assert "AUTOGRADER_MEMORY='lots'" in capsys.readouterr().err


def test_batch_workers_get_the_settings_object_not_the_environment(tmp_path, monkeypatch):
    """Before: each worker copied the parent's AUTOGRADER_* variables as they were when its pool
    started. Now the workers take the Settings the entry point read (pickled to them): a
    variable changed afterwards reaches no worker."""
    from autograder.batch import workers
    from autograder.grading.grader import Grader
    from autograder.references.cache import REFERENCES
    from autograder.sandbox.modes import SandboxChoice, SandboxMode

    monkeypatch.setenv("AUTOGRADER_SOLUTIONS", str(tmp_path / "read-once"))
    monkeypatch.setenv("AUTOGRADER_CELL_TIMEOUT", "7")
    grader = Grader(device="cpu", seed=7, sandbox=SandboxChoice(SandboxMode.FALLBACK), settings=Settings.from_env())
    monkeypatch.setenv("AUTOGRADER_SOLUTIONS", str(tmp_path / "changed-later"))
    monkeypatch.setenv("AUTOGRADER_CELL_TIMEOUT", "99")
    monkeypatch.setattr(REFERENCES, "warm", lambda *a, **k: None)
    with workers._worker_pool(grader, 1, ["01_intuition"]) as pool:
        seen = pool.submit(settings_module.current).result(timeout=120)
    assert seen == grader.settings
    assert (seen.solutions, seen.limits.cell_timeout) == (Path(tmp_path / "read-once"), 7.0)
