"""Integrations with nbgrader and Gradescope."""
