"""The reference implementations (taken from the solution notebooks) and their outcomes
kept on disk between runs: the instructor's secrets, never staged into the sandbox."""
