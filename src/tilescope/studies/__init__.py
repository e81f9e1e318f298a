"""Reproducible studies: the reference workflows, runnable as `tilescope demo` and from examples/."""
