"""The `tilescope` command."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def _cmd_demo(args) -> int:
    import os

    from .spec import preset

    try:  # a clear line, not a traceback, for a name that is not a preset (the flag's or the variable's)
        preset(args.preset or os.environ.get("TILESCOPE_PRESET") or None)
    except (KeyError, ValueError) as e:
        print(f"tilescope demo: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    if args.preset:
        os.environ["TILESCOPE_PRESET"] = args.preset
    from .studies.rmsnorm import demo

    demo(args.out, args.dtype, args.device)
    return 0


def _cmd_presets(args) -> int:
    from ._console import console
    from rich.table import Table

    from .spec import preset, preset_names

    t = Table(title="hardware presets")
    for col in ("name", "core", "TensorE bf16 TFLOPS", "DMA GB/s", "HBM GB/s/core", "SBUF/partition", "description"):
        t.add_column(col)
    for name in preset_names():
        p = preset(name)
        t.add_row(name, p.generation, f"{p.peak_flops() / 1e12:.1f}", f"{p.dma.bytes_per_ns:.0f}",
                  f"{p.hbm_bytes_per_ns:.0f}", f"{p.sbuf_bytes_per_partition // 1024} KiB", p.description)
    console().print(t)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilescope", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tilescope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the main demo on the simulated device")
    demo.add_argument("--preset", default=None, help="hardware preset (default trn1 or $TILESCOPE_PRESET)")
    demo.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    demo.add_argument("--device", choices=("sim", "cpu", "cuda"), default="sim",
                      help="where the study runs (sim: modeled; cpu/cuda: measured)")
    demo.add_argument("--out", default="profile_out/rmsnorm", help="where the three profiles go")
    demo.set_defaults(func=_cmd_demo)
    presets = sub.add_parser("presets", help="list hardware presets")
    presets.set_defaults(func=_cmd_presets)
    from .profiler.internal import register_cli as _register_profiler  # profile, doctor, share

    _register_profiler(sub)
    from .trace.internal import register_cli as _register_trace  # report, diff, compare, sql, replay

    _register_trace(sub)
    from .explorer.internal import register_cli as _register_explorer  # explore

    _register_explorer(sub)
    from .nki.internal import register_cli as _register_nki  # nki run

    _register_nki(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
