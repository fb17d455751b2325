"""Plain data both sides of the sandbox speak: test calls and outcomes, the wire format, the
messages, the exercise contract. Staged into the sandbox with `runtime/`: imports nothing else."""
