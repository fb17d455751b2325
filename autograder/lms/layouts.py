"""Each LMS's download, recognised by its names: Canvas's flat `<lastfirst>[_LATE]_<id>_...` files,
Moodle's per-student folders or flat files, Gradescope's `submission_<id>` folders and its
`submission_metadata.yml`; each entry collected under the student it belongs to."""
from __future__ import annotations


import json
import re
from dataclasses import dataclass, field

from .uploads import LmsImportError, Node


LMS_NAMES = {"canvas": "Canvas", "moodle": "Moodle", "gradescope": "Gradescope"}
ID_KINDS = {"canvas": "Canvas user id", "moodle": "Moodle participant id", "gradescope": "Gradescope SID"}
LATE_NOTE = "LATE: Canvas marked the submission late"

_CANVAS = re.compile(r"^(?P<name>[^_]+?)(?P<late>_LATE)?_(?P<uid>\d+)_(?P<sid>\d+)_(?P<orig>.+)$")
_CANVAS_NO_SID = re.compile(r"^(?P<name>[^_]+?)(?P<late>_LATE)?_(?P<uid>\d+)_(?P<orig>.+)$")  # (online text)
_MOODLE_DIR = re.compile(r"^(?P<name>.+?)_(?P<pid>\d+)_assignsubmission_(?P<plugin>[A-Za-z]+)_?$")
_MOODLE_FILE = re.compile(r"^(?P<name>.+?)_(?P<pid>\d+)_assignsubmission_(?P<plugin>[A-Za-z]+)_(?P<orig>.+)$")
_GS_DIR = re.compile(r"^submission_(?P<id>\d+)$")
_GS_FILE = re.compile(r"^submission_(?P<id>\d+)\.[A-Za-z0-9]+$")  # (a PDF assignment's upload)
GS_METADATA = "submission_metadata.yml"


@dataclass
class Unplaced:
    source: str        # where it is, inside the export
    reason: str
    student: str | None = None  # the folder of the student it belongs to, when known


# -- the per-LMS layouts ---------------------------------------------------------------------------
@dataclass
class StudentFiles:
    key: str       # the LMS's id for the student
    name: str
    id_kind: str
    email: str = ""
    notes: list = field(default_factory=list)
    items: list = field(default_factory=list)  # [(node, name to read it by, LMS order or None)]
    folder: str = ""


class Collector:
    """Students found in the export, and what could not be attributed to anyone."""

    def __init__(self, lms: str):
        self.lms = lms
        self.students: dict[str, StudentFiles] = {}
        self.unplaced: list[Unplaced] = []

    def student(self, key: str, name: str, id_kind: str | None = None, email: str = "") -> StudentFiles:
        s = self.students.get(key)
        if s is None:
            s = self.students[key] = StudentFiles(key, name, id_kind or ID_KINDS[self.lms], email)
        return s

    def skip(self, node: Node, reason: str) -> None:
        self.unplaced.append(Unplaced(node.origin, reason))


def collect_canvas(top: list, col: Collector) -> None:
    known = {m["uid"] for m in (_CANVAS.match(n.name) for n in top) if m}
    for node in top:
        m = _CANVAS.match(node.name)
        if not m:  # a file without a submission id (online text): only for a student seen already
            m = _CANVAS_NO_SID.match(node.name)
            if m and m["uid"] not in known:
                m = None
        if not m:
            col.skip(node, "not named like a Canvas download (<lastfirst>[_LATE]_<user id>_<submission id>_"
                           "<file name>): whose it is is unknown")
            continue
        s = col.student(m["uid"], m["name"])
        if m["late"] and LATE_NOTE not in s.notes:
            s.notes.append(LATE_NOTE)
        order = int(m["sid"]) if "sid" in m.groupdict() else None
        s.items.append((node, m["orig"], order))


def collect_moodle(top: list, col: Collector) -> None:
    for node in top:
        m = (_MOODLE_DIR if node.is_dir else _MOODLE_FILE).match(node.name)
        if not m:
            col.skip(node, "not named like a Moodle download (<Full Name>_<participant id>_assignsubmission_"
                           "file_...): whose it is is unknown")
            continue
        s = col.student(m["pid"], m["name"].strip())
        s.items.append((node, node.name if node.is_dir else m["orig"], None))


def collect_gradescope(top: list, col: Collector) -> None:
    meta_node = next((n for n in top if n.name == GS_METADATA and not n.is_dir), None)
    if meta_node is None:
        raise LmsImportError(f"no {GS_METADATA} in the Gradescope export: whose submission is whose is unknown")
    try:
        meta = parse_gradescope_metadata(meta_node.read())
    except Exception as e:
        raise LmsImportError(f"{meta_node.origin}: cannot read it ({type(e).__name__}: {e})") from None
    for node in top:
        if node is meta_node:
            continue
        m = (_GS_DIR if node.is_dir else _GS_FILE).match(node.name)
        if not m:
            col.skip(node, "not a Gradescope submission (submission_<id>): whose it is is unknown")
            continue
        sub_id = m["id"]
        entry = meta.get(f"submission_{sub_id}")
        if not entry or not entry["submitters"]:
            col.skip(node, f"submission {sub_id} is not in {GS_METADATA}: whose it is is unknown")
            continue
        people = entry["submitters"]
        for person in people:
            key, kind = ((person["sid"], "Gradescope SID") if person["sid"]
                         else (person["email"], "Gradescope email") if person["email"]
                         else (f"submission_{sub_id}", "Gradescope submission id"))
            s = col.student(key, person["name"], kind, person["email"])
            if len(people) > 1:
                others = ", ".join(p["name"] or p["email"] for p in people if p is not person)
                note = f"group submission {sub_id} with {others}"
                if note not in s.notes:
                    s.notes.append(note)
            s.items.append((node, node.name, int(sub_id)))


def parse_gradescope_metadata(data: bytes) -> dict:
    """Gradescope's submission_metadata.yml -> {"submission_<id>": {"submitters": [{"name", "sid",
    "email"}], "created_at": str}}. Its keys are Ruby symbols (':submission_123:', ':name:'),
    which YAML reads as strings with a leading colon. With PyYAML where it is installed (the grader
    does not need it), else with a reader of the block-style subset Gradescope writes."""
    text = data.decode("utf-8-sig")
    try:
        import yaml
    except ImportError:
        yaml = None
    raw = None
    if yaml is not None:
        class Loader(yaml.SafeLoader):  # Ruby's tags (!ruby/hash:...) read as plain YAML
            pass

        def untagged(loader, suffix, node):
            if isinstance(node, yaml.MappingNode):
                return loader.construct_mapping(node, deep=True)
            if isinstance(node, yaml.SequenceNode):
                return loader.construct_sequence(node, deep=True)
            return loader.construct_scalar(node)

        Loader.add_multi_constructor("!", untagged)
        try:
            raw = yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError:
            raw = None
    if raw is None:
        raw = _mini_yaml(text)
    if not isinstance(raw, dict):
        raise ValueError("not a mapping of submissions")
    out = {}
    for key, value in raw.items():
        key = str(key).lstrip(":")
        if not key.startswith("submission_") or not isinstance(value, dict):
            continue
        value = {str(k).lstrip(":"): v for k, v in value.items()}
        people = []
        for p in value.get("submitters") or []:
            if isinstance(p, dict):
                p = {str(k).lstrip(":"): v for k, v in p.items()}
                people.append({k: "" if p.get(k) is None else str(p.get(k)).strip()
                               for k in ("name", "sid", "email")})
        out[key] = {"submitters": people, "created_at": str(value.get("created_at") or "")}
    return out


def _mini_yaml(text: str):
    """Block mappings, block sequences (also at their key's indentation, as Ruby writes them),
    plain and quoted scalars, `|`/`>` blocks and plain scalars continued on deeper lines; every
    scalar a string (or None / [] / {}). Enough for Gradescope's metadata."""
    lines = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or stripped in ("---", "..."):
            continue
        lines.append([len(raw) - len(raw.lstrip(" ")), raw.strip()])
    return _MiniYamlReader(lines).block()(lines[0][0]) if lines else None


def _yaml_scalar(v: str):
    v = v.strip()
    if v in ("", "~", "null"):
        return None
    if v == "[]":
        return []
    if v == "{}":
        return {}
    if len(v) >= 2 and v[0] == v[-1] == "'":
        return v[1:-1].replace("''", "'")
    if len(v) >= 2 and v[0] == v[-1] == '"':
        try:
            return json.loads(v)
        except ValueError:
            return v[1:-1]
    return v


def _is_item(line: list) -> bool:
    """Whether a line is a sequence item ("- ..." or a lone "-")."""
    return line[1][:1] == "-" and line[1][1:2] in ("", " ")


class _MiniYamlReader:
    """`_mini_yaml`'s reader: `lines` ([indent, text], blank lines and comments left out), read
    from `pos` on."""

    def __init__(self, lines: list):
        self.lines, self.pos = lines, 0

    def continued(self, indent: int, first: str):
        """The scalar `first` of a line at `indent`, with the deeper lines that continue it."""
        lines, parts = self.lines, []
        while self.pos < len(lines) and lines[self.pos][0] > indent:
            parts.append(lines[self.pos][1])
            self.pos += 1
        if first in ("|", ">", "|-", ">-", "|+", ">+"):
            return ("\n" if first[0] == "|" else " ").join(parts)
        return _yaml_scalar(" ".join([first] + parts))

    def block(self):
        """The method that reads the block at `pos`, a sequence or a mapping (there is a line at
        `pos`). Returned, not called, so that a level of nesting costs one frame of recursion."""
        return self.sequence if _is_item(self.lines[self.pos]) else self.mapping

    def sequence(self, indent: int) -> list:
        lines, items = self.lines, []
        while self.pos < len(lines) and lines[self.pos][0] == indent and _is_item(lines[self.pos]):
            rest = lines[self.pos][1][1:].lstrip()
            if not rest:
                self.pos += 1
                deeper = self.pos < len(lines) and lines[self.pos][0] > indent
                items.append(self.block()(lines[self.pos][0]) if deeper else None)
            elif _KEY.match(rest):  # "- key: value": a mapping whose first line this is
                lines[self.pos] = [indent + len(lines[self.pos][1]) - len(rest), rest]
                items.append(self.block()(lines[self.pos][0]))
            else:
                self.pos += 1
                items.append(self.continued(indent, rest))
        return items

    def mapping(self, indent: int) -> dict:
        lines, mapping = self.lines, {}
        while self.pos < len(lines) and lines[self.pos][0] == indent and not _is_item(lines[self.pos]):
            m = _KEY.match(lines[self.pos][1])
            if not m:
                raise ValueError(f"cannot read line {lines[self.pos][1]!r}")
            key, value = str(_yaml_scalar(m["key"])), (m["value"] or "").strip()
            self.pos += 1
            if value:
                mapping[key] = self.continued(indent, value)
            elif self.pos < len(lines) and (lines[self.pos][0] > indent or (
                    lines[self.pos][0] == indent and lines[self.pos][1][:1] == "-")):
                mapping[key] = self.block()(lines[self.pos][0])
            else:
                mapping[key] = None
        return mapping


_KEY = re.compile(r"""^(?P<key>"[^"]*"|'[^']*'|\S.*?):(?:\s+(?P<value>.*))?$""")


def detect(top: list) -> str | None:
    """Which LMS made an export with these top-level entries (None: none recognised)."""
    names = {n.name for n in top}
    if GS_METADATA in names or any(n.is_dir and _GS_DIR.match(n.name) for n in top):
        return "gradescope"
    scores = {
        "moodle": sum(bool((_MOODLE_DIR if n.is_dir else _MOODLE_FILE).match(n.name)) for n in top),
        "canvas": sum(bool(not n.is_dir and _CANVAS.match(n.name)) for n in top),
    }
    best = max(scores, key=scores.get)
    return best if scores[best] else None


def is_student_entry(node: Node) -> bool:
    return bool(_MOODLE_DIR.match(node.name) or _GS_DIR.match(node.name) or _CANVAS.match(node.name)
                or node.name == GS_METADATA)
