"""Reports of a SubmissionResult: text for the terminal, Gradescope JSON, an HTML feedback page."""
