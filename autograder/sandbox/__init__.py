"""The grader side of isolation: limits, the sandbox modes, launching and killing the
processes that run student code, their pools, student uids, and a shared GPU."""
