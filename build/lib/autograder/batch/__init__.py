"""Grading a whole class: the batch run, its journal, and the server its workers fork from."""
