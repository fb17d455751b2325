"""One student's notebook in a sandbox, from the grader's side: the session, its pipes, and
the checks on everything the child reports before the grader believes it."""
