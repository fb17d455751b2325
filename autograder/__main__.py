"""`python -m autograder`: the command line (cli.py)."""
import sys

from .cli import main

if __name__ == "__main__":  # guarded: batch grading's spawned workers re-import this module
    sys.exit(main())
