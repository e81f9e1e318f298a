"""What tilescope's other packages use of the explorer beyond its public API: the CLI's
``explore`` sub-command. No stability promise."""

from __future__ import annotations

from ._explore_cli import register as register_cli

__all__ = ["register_cli"]
