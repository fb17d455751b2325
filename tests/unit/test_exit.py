"""`python -m autograder` ends with `autograder.__main__.exit_now` (no interpreter teardown):
what the teardown would have done still happens, and the command's exit code is kept."""
import subprocess
import sys

SCRIPT = '''
import atexit, concurrent.futures, sys
POOL = concurrent.futures.ThreadPoolExecutor(2)  # never shut down: the interpreter's exit would
POOL.submit(lambda: 1).result()                  # stop it, and so must exit_now
atexit.register(lambda: print("atexit ran", flush=True))
print("unflushed", end="")
from autograder.__main__ import exit_now
exit_now(3)
'''


def test_exit_now_keeps_the_code_runs_atexit_stops_thread_pools_and_flushes():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert r.stdout == "unflushedatexit ran\n", r.stdout
