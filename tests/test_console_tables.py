"""Terminal tables never cut a number, whatever the terminal's width or a pipe's."""

import io

from rich.table import Table

from tilescope._console import console
from tilescope.studies import rmsnorm


def _rows(label_times):
    return {label: {"kind": "cpu", "preset": None, "source": "host time, measured on this CPU", "executions": 0,
                    "device_us": us, "hbm_bytes": None, "durations_us": [], "assumed": {}}
            for label, us in label_times.items()}


def test_the_demo_table_keeps_its_times_whole_in_a_pipe(monkeypatch, capsys):
    """``tilescope demo --device cpu | cat``: the table printed 80 columns wide cut the times."""
    rows = _rows({"naive (cpu)": 1044917.25, "fused (cpu)": 1064512.5, "compiled (cpu)": 182776123.375})
    monkeypatch.setattr(rmsnorm, "summarize", lambda p: rows[p])
    monkeypatch.setenv("COLUMNS", "80")
    rmsnorm.compare({label: label for label in rows})
    out = capsys.readouterr().out
    assert "…" not in out
    for text in ("1,044,917.2 us", "1,064,512.5 us", "182,776,123.4 us", "0.98x", "171.70x"):
        assert text in out, (text, out)


def test_numbers_stay_whole_and_text_wraps_at_any_width():
    for width in (120, 80, 60, 30):
        t = Table("operator name", "calls", "total", "mean", "share", title="ops")
        t.add_row("aten::scaled_dot_product_attention_with_a_long_name", "12,345", "98,765,432.1 us",
                  "8,000.5 us", "99.9%")
        out = console(width=width, file=io.StringIO(), color_system=None)
        out.print(t)
        text = out.file.getvalue()
        assert "…" not in text, (width, text)
        for number in ("12,345", "98,765,432.1 us", "8,000.5 us", "99.9%"):
            assert number in text, (width, number, text)
        if width >= 80:  # room for every number: the text column wraps to fit the terminal
            assert max(len(line) for line in text.splitlines()) <= width, text
