"""`python -m autograder`: the command line (cli.py)."""
import sys

from .cli import main


def exit_now(code) -> None:
    """End the process once the command has written everything, without the interpreter's
    teardown: freeing torch and the reference outcomes one object at a time took 0.3-0.4 s of a
    4 s `grade` (2 cores). What teardown would still do is done first, as the interpreter does
    it: threading's shutdown (thread pools told to stop, their threads joined), the atexit
    handlers (the sandboxes, the staged runtime, multiprocessing), the output flushed. (Every
    file the grader writes is closed or flushed already.)"""
    import atexit
    import os
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more can be said
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def stop_as_ctrl_c() -> None:
    """A scheduler's SIGTERM (Slurm at its time limit, `timeout`, `kill`) and a closed
    terminal's SIGHUP stop the command as Ctrl-C does: KeyboardInterrupt in the main thread, so
    its sandboxes are closed, its temporary folders removed and a batch's journal kept (by
    default they end the process at once, leaving all that to chance). Only the first of them
    counts; a signal the command was started to ignore stays ignored (`nohup` ignores SIGHUP)."""
    import signal

    stopped = []

    def interrupt(signum, frame):
        if not stopped:  # (only the first: a second would cut the closing of the sandboxes short)
            stopped.append(signum)
            raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, interrupt)


if __name__ == "__main__":  # guarded: batch grading's spawned workers re-import this module
    stop_as_ctrl_c()
    exit_now(main())
