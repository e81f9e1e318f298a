"""What tilescope's other packages use of the NKI front end beyond its public API: the CLI's
``nki run`` sub-command. No stability promise."""

from __future__ import annotations

from ._nki_cli import register as register_cli

__all__ = ["register_cli"]
