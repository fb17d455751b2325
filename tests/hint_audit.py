"""Print what a student who ported someone else's code reads: score and hint for every port in
tests/ports.py, and whether the hint names the actual mistake. A measurement, not a test:

    python tests/hint_audit.py            # one line per port, then the count
    python tests/hint_audit.py worksheet  # only the ports whose name contains "worksheet"
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grading_helpers import grade_in, namespace_of  # noqa: E402
from ports import PORTS  # noqa: E402


def main() -> int:
    named = wrong = 0
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    for p in (chosen := [p for p in PORTS if only in p.name]):
        result = grade_in(p.chapter, namespace_of(p.chapter, p.src))
        e = result[p.exercise]
        first = e["first"]
        hints = e["hints"]
        others = [f"{ex} {r['score']:.2f}/{r['max']:g}" for ex, r in result.items()
                  if ex != p.exercise and abs(r["score"] - r["max"]) > 1e-9]
        if p.mistake is None:
            ok = abs(e["score"] - e["max"]) < 1e-9 and not others
        else:
            ok = e["score"] < e["max"] and (p.words is None or any(p.words in h for h in hints + [first.message]))
        named += ok
        wrong += not ok
        print(f"{'OK ' if ok else 'BAD'} {p.name} [{p.exercise}] {e['score']:.2f}/{e['max']:g}"
              + (f" (also lost: {', '.join(others)})" if others else ""))
        if first is not None:
            print(f"      case: {first.case}\n      message: {first.message}\n      hints: {hints}")
    print(f"\n{named} of {len(chosen)} ports graded right with a hint naming the actual mistake ({wrong} not)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
