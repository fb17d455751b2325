"""The server that batch workers fork from, with torch and the grader imported once.

Kept free of torch imports itself, so the command line can start the server first and import
torch in parallel with it (two imports of ~2 s each, on two cores at once).
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver

# What a worker would otherwise import on its first chapter: torch and the grader, nbformat
# (reading notebooks). IPython's input transformer is loaded without the IPython package
# (source/notebook: 0.03 s where a worker needs it). Not sympy (torch's symbolic shapes): only
# the device check's meta kernels need it, and a worker runs none (it
# gets every reference outcome, computed by the command before the workers start; imported
# where one is missing).
PRELOAD = ["autograder.grading.grader", "autograder.session.student_session", "autograder.source.notebook"]


def context():
    """The multiprocessing context of the batch workers; starts the server (and its imports).
    Where there is no forkserver (Windows), workers are spawned and import for themselves."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()
    from multiprocessing import util

    from ..sandbox import scratch
    scratch.list_folder(util.get_temp_dir())  # (the server's socket's: a killed batch leaves it)
    return ctx
