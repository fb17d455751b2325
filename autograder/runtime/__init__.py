"""What runs beside student code, inside the sandbox: the chapter child and its warm and
forked forms, the zygote, the executor, the confinements, the device check. Staged whole with
`shared/`, and imports nothing else of the package (tests/unit/test_runtime_boundary.py): no cases,
no hints, no references."""
