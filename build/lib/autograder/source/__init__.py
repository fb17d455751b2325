"""A submission's source, read without running it: notebook cells and static checks."""
