"""``tilescope nki run FILE.py[::NAME] [-- ARGS...]``: run an NKI kernel file unchanged."""

from __future__ import annotations

import sys
import traceback

__all__ = ["register"]


def _cmd_run(args) -> int:
    from ..errors import TilescopeError
    from ._run_file import run_file

    extra = list(args.args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        run = run_file(args.target, argv=extra, profile_dir=None if args.no_profile else args.profile_dir,
                       preset=args.preset)
    except FileNotFoundError as e:
        print(f"tilescope nki run: {e}", file=sys.stderr)
        return 2
    except TilescopeError as e:  # the user's line, without tilescope's frames
        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
        return 1
    print(run.table())
    if run.profile_dir is not None:
        print(f"profile: {run.profile_dir}  (open it: tilescope explore {run.profile_dir})")
    return run.exit_code


def register(sub) -> None:
    nki = sub.add_parser("nki", help="run NKI kernel files on the simulator (values + modeled timeline)")
    nsub = nki.add_subparsers(dest="nki_command", metavar="SUBCOMMAND")
    run = nsub.add_parser(
        "run", help="run FILE.py (its __main__ path) or FILE.py::NAME with its nki / neuronxcc.nki imports "
                    "mapped to tilescope for this run, and write a profile of every launch")
    run.add_argument("target", help="FILE.py or FILE.py::NAME (a kernel, or a function of no arguments)")
    run.add_argument("args", nargs="*", help="arguments for the file (after --)")
    run.add_argument("--profile-dir", default="profile_out/nki", help="where the profile goes (default %(default)s)")
    run.add_argument("--no-profile", action="store_true", help="write no profile")
    run.add_argument("--preset", default=None, help="hardware preset (default trn1 or $TILESCOPE_PRESET)")
    run.set_defaults(func=_cmd_run)
    nki.set_defaults(func=lambda args: (nki.print_help(), 0)[1])
