"""What tilescope's other packages use of the analysis engine beyond its public API (:mod:`tilescope.trace`).

The explorer shares the engine's label rules, its DuckDB-to-Arrow conversion and the HTA
analyses the report runs. It imports these from here, never from trace's private modules.
No stability promise.
"""

from __future__ import annotations

from ._analysis_cli import register as register_cli
from ._labels import distinct, short_label, split_name
from ._report import hta_analyses
from ._trace import _arrow as arrow

__all__ = ["arrow", "distinct", "short_label", "split_name", "hta_analyses", "register_cli"]

