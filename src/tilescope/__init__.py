"""tilescope: a hardware-free re-creation of a Trainium-class accelerator's PyTorch toolchain."""

__version__ = "0.1.0"

# name -> module that defines it; imported on first use so `import tilescope` stays cheap
_LAZY = {
    "kernel": "tilescope.lang._kernel",
    "simulate": "tilescope.lang._simulate",
    "profile": "tilescope.profiler._profile_block",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tilescope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def _start_profile_from_env() -> None:
    """``TILESCOPE_PROFILE=1 python script.py``: profile the whole run, no code change."""
    from ._env import flag

    if flag("TILESCOPE_PROFILE", False):
        from .profiler import start_from_env

        start_from_env()


_start_profile_from_env()
