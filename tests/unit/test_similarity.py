"""Copies found the way instructors find them (report/similarity.py): a copy of the published
solution with its local variables renamed and its comments rewritten is still flagged as
identical; two students whose code of an exercise is the same once normalised are paired in the
class report; different code, stubs and short code are not; no score changes."""
from __future__ import annotations

import ast
import json

from autograder.report import class_report, similarity
from autograder.shared.contract import CHAPTERS
from grading_helpers import REPO

CH2 = "02_scaled_dot_product_attention"
SDPA = "scaled_dot_product_attention"

OTHER = '''def scaled_dot_product_attention(q, k, v, mask=None):
    """My own take."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = torch.einsum("...qd,...kd->...qk", q, k) * scale
    if mask is not None and mask.dtype == torch.bool:
        logits = logits.masked_fill(~mask, -1e30)
    elif mask is not None:
        logits = logits + mask
    probs = torch.exp(logits - logits.amax(-1, keepdim=True))
    probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-30)
    return torch.einsum("...qk,...kd->...qd", probs, v), probs
'''


def _renamed(source: str, suffix: str) -> str:
    """The definition with every variable it assigns renamed (name + suffix), reformatted by
    ast.unparse (comments gone) and a comment of the student's own on top: a disguised copy."""
    tree = ast.parse(source)
    fn = tree.body[0]
    assigned = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and n.id in assigned:
            n.id += suffix
    return "# written by me, honest\n" + ast.unparse(tree).replace("    ", "  ")


def _notebook(path, cell_text: str | None):
    """Chapter 2's solution notebook with the SDPA cell replaced by `cell_text` (None: the stub
    of the released exercise notebook)."""
    nb = json.loads((REPO / ("solutions" if cell_text else "exercises") / f"{CH2}.ipynb").read_text())
    if cell_text:
        for cell in nb["cells"]:
            if "".join(cell["source"]).startswith(f"def {SDPA}("):
                cell["source"] = cell_text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    return path


def _solution_cell() -> str:
    nb = json.loads((REPO / "solutions" / f"{CH2}.ipynb").read_text())
    return next("".join(c["source"]) for c in nb["cells"] if "".join(c["source"]).startswith(f"def {SDPA}("))


def test_a_renamed_variable_copy_of_the_solution_is_flagged(tmp_path):
    copy = _notebook(tmp_path / "a" / f"{CH2}.ipynb", _renamed(_solution_cell(), "_x"))
    assert "scores_x" in copy.read_text() and "written by me" in copy.read_text()
    assert [CH2, SDPA] in class_report.identical_to_solutions([(CH2, copy)])
    other = _notebook(tmp_path / "b" / f"{CH2}.ipynb", OTHER)
    assert [CH2, SDPA] not in class_report.identical_to_solutions([(CH2, other)])


def test_a_changed_operation_is_not_identical():
    src = _solution_cell().replace("math.sqrt(d_k)", "d_k")
    tree = ast.parse(src).body[0]
    solution = ast.parse(_solution_cell()).body[0]
    assert similarity.dump(tree) != similarity.dump(solution)
    assert similarity.dump(ast.parse(_renamed(_solution_cell(), "_y")).body[0]) == similarity.dump(solution)


def _shared_mistake() -> str:
    """The solution with one change two students share (not the solution: not flagged as it)."""
    return _solution_cell().replace("math.sqrt(d_k)", "d_k ** 0.25")


def test_students_with_the_same_normalised_code_are_paired(tmp_path):
    code = {
        "ann": similarity.fingerprints([(CH2, _notebook(tmp_path / "ann.ipynb", _renamed(_shared_mistake(), "_a")))]),
        "bo": similarity.fingerprints([(CH2, _notebook(tmp_path / "bo.ipynb", _renamed(_shared_mistake(), "_b")))]),
        "sol": similarity.fingerprints([(CH2, _notebook(tmp_path / "sol.ipynb", _renamed(_solution_cell(), "_c")))]),
        "cy": similarity.fingerprints([(CH2, _notebook(tmp_path / "cy.ipynb", OTHER))]),
        "dee": similarity.fingerprints([(CH2, _notebook(tmp_path / "dee.ipynb", None))]),  # the stub
        "eve": similarity.fingerprints([(CH2, _notebook(tmp_path / "eve.ipynb", None))]),
    }
    column = f"{CH2}: {SDPA}"
    assert column in code["ann"] and column in code["cy"]
    assert column not in code["dee"]  # the released stub is not compared (everyone has it)
    found = similarity.pairs(code)
    by_pair = {tuple(p["students"]): dict(p["exercises"]) for p in found}
    assert by_pair[("ann", "bo")][column] == 1.0
    assert not any("cy" in pair and column in ex for pair, ex in by_pair.items())
    assert not any("dee" in pair or "eve" in pair for pair in by_pair)
    # a copy of the published solution is flagged as that, not paired with every other copy
    assert column not in code["sol"] and not any("sol" in pair for pair in by_pair)


def test_the_class_report_lists_the_pair_and_changes_no_score(tmp_path):
    from autograder.grading.results import ChapterResult, SubmissionResult

    out = tmp_path / "out"
    for name, text in (("ann", _renamed(_shared_mistake(), "_a")), ("bo", _renamed(_shared_mistake(), "_b")),
                       ("cy", OTHER)):
        nb = _notebook(tmp_path / "class" / name / f"{CH2}.ipynb", text)
        r = SubmissionResult(str(nb.parent), [ChapterResult(CH2, str(nb), [])])
        class_report.save(out, name, r, tmp_path / "class")
    page = class_report.write(out).read_text(encoding="utf-8")
    section = page[page.index("<table id='similar'>"):]
    section = section[:section.index("</table>")]
    assert "ann and bo" in section and "cy" not in section
    saved = json.loads((out / "ann" / class_report.SAVED).read_text())
    assert saved["result"]["score"] == 0.0  # (what was saved is the grading's, untouched)


def test_hostile_code_is_read_without_harm(tmp_path):
    """Code too deep to parse, a huge exercise and a notebook that is not JSON flag nothing and
    raise nothing; what is kept of one exercise is bounded."""
    deep = "def scaled_dot_product_attention(q, k, v, mask=None):\n    return " + "(" * 20000 + "q" + ")" * 20000
    huge = "def scaled_dot_product_attention(q, k, v, mask=None):\n" + "".join(
        f"    x{i} = q + k * {i}\n" for i in range(20000)) + "    return x0, x1\n"
    for name, text in (("deep", deep), ("huge", huge)):
        nb = _notebook(tmp_path / name / f"{CH2}.ipynb", text)
        assert [CH2, SDPA] not in class_report.identical_to_solutions([(CH2, nb)])
        streams = similarity.fingerprints([(CH2, nb)])
        assert len(streams.get(f"{CH2}: {SDPA}", "").split()) <= similarity.MAX_TOKENS
    bad = tmp_path / "bad" / f"{CH2}.ipynb"
    bad.parent.mkdir()
    bad.write_text("{ not json")
    assert similarity.fingerprints([(CH2, bad)]) == {} and class_report.identical_to_solutions([(CH2, bad)]) == []


def test_methods_attached_with_add_to_class_are_compared(tmp_path):
    """Chapter 6's notebook writes `prepare_qkv_global` and `forward` in cells of their own with
    `@add_to_class(MultiHeadAttention)`. Before: a copy of the solution was never flagged on
    `prepare_qkv_global` (nothing was found for it) and the class was compared without them."""
    ch6 = "06_gated_global_attention"
    nb = json.loads((REPO / "solutions" / f"{ch6}.ipynb").read_text())
    copy = tmp_path / "a" / f"{ch6}.ipynb"
    copy.parent.mkdir()
    copy.write_text(json.dumps(nb))
    flagged = class_report.identical_to_solutions([(ch6, copy)])
    assert [ch6, "prepare_qkv_global"] in flagged and [ch6, "MultiHeadAttention"] in flagged
    for cell in nb["cells"]:  # a change in the attached forward alone: the class is not identical
        text = "".join(cell["source"])
        if text.startswith("@add_to_class(MultiHeadAttention)\ndef forward("):
            assert "torch.sigmoid(" in text
            cell["source"] = text.replace("torch.sigmoid(", "torch.tanh(")
    changed = tmp_path / "b" / f"{ch6}.ipynb"
    changed.parent.mkdir()
    changed.write_text(json.dumps(nb))
    flagged = class_report.identical_to_solutions([(ch6, changed)])
    assert [ch6, "prepare_qkv_global"] in flagged and [ch6, "MultiHeadAttention"] not in flagged
    ex = {e.name: e for e in CHAPTERS[ch6].exercises}
    in_body = ("class MultiHeadAttention:\n    def forward(self, x):\n        return x\n\n"
               "    def prepare_qkv_global(self, q, k, v):\n        return q\n")  # (attached ones come last)
    attached = ("class MultiHeadAttention:\n    def forward(self, x):\n        return x\n",
                "@add_to_class(MultiHeadAttention)\ndef prepare_qkv_global(self, q, k, v):\n    return q\n")
    for name in ("prepare_qkv_global", "MultiHeadAttention"):  # written either way, the same code
        same = [similarity.dump(similarity.exercise_node(similarity.definitions(cells), ex[name]))
                for cells in ([in_body], list(attached))]
        assert same[0] is not None and same[0] == same[1], name
    # The class defined again after the attachment: the run's class has no attached method.
    again = [*attached, "class MultiHeadAttention:\n    def prepare_qkv_global(self, q, k, v):\n        return k\n"]
    node = similarity.exercise_node(similarity.definitions(again), ex["prepare_qkv_global"])
    assert ast.unparse(node).endswith("return k")
