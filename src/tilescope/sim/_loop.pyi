# The scheduler's loop in C (_loop.c): the types its Python caller relies on.
from typing import Any

def run(*args: Any) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes]: ...
