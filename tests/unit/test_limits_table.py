"""The README's limits table is the one `python -m autograder --help-limits` prints, generated
from `Limits`' own field help: a limit added or changed in the code and not in the README fails."""
import re
import subprocess
import sys

from autograder.sandbox.limits import Limits, limits_table

from grading_helpers import REPO


def test_the_readme_shows_the_limits_the_grader_applies():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shown = re.search(r"<!-- limits: .*?-->\n(.*?)\n<!-- end of limits -->", readme, re.S)
    assert shown, "README.md has no generated limits table"
    assert shown.group(1) == limits_table()


def test_every_limit_has_help_and_help_limits_prints_them():
    out = subprocess.run([sys.executable, "-m", "autograder", "--help-limits"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    for name, value in vars(Limits()).items():
        assert f"`AUTOGRADER_{name.upper()}`" in out.stdout, name
    assert "| `AUTOGRADER_MEMORY` | 4G |" in out.stdout
