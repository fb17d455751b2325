#!/usr/bin/env python3
"""Per-call cost of the forbidden-op recorder: every CPU case of the reference solutions run
with the recorder and with a do-nothing stand-in, in one process, alternating, medians."""
import statistics, time
import torch
torch.set_num_threads(1)
import autograder.runtime.execute as E
from autograder.cases import build_cases
from autograder.shared.contract import CHAPTERS
from autograder.references.solutions import load_reference
calls = []
for ch in CHAPTERS:
    ref = load_reference(ch)
    for ex in CHAPTERS[ch].exercises:
        for c in build_cases(ch, ex.name, ref, seed=0, quick=False):
            if not c.capped_memory:
                calls.append((ref, c))
class Null:
    def __init__(self, seen): pass
    def __enter__(self): return self
    def __exit__(self, *e): return False
real = E._Recorder
def run():
    t = time.process_time()
    for ref, c in calls:
        E.execute(ref, c)
    return time.process_time() - t
run()
with_rec, without = [], []
for _ in range(5):
    E._Recorder = real; with_rec.append(run())
    E._Recorder = Null; without.append(run())
n = len(calls)
a, b = statistics.median(with_rec), statistics.median(without)
a, b = min(with_rec), min(without)
print(f"(process CPU time, best of 5) {n} calls: with recorder {a/n*1e3:.3f} ms/call, without {b/n*1e3:.3f} ms/call, recorder {1e3*(a-b)/n:.3f} ms/call")
