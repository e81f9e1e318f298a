"""Fused built-ins as single device executions (registered below)."""


def register(lib) -> None:
    return None
