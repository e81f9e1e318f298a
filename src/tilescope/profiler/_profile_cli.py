"""`tilescope profile`, `tilescope doctor` and `tilescope share`."""

from __future__ import annotations

import sys

__all__ = ["register"]


def _cmd_profile(args) -> int:
    from ._auto import run_script
    from ._config import ProfileConfig

    try:  # a bad option is one line, before the script runs
        modes = [m for m in args.mode.split(",") if m.strip()] if args.mode else None
        cfg = ProfileConfig(output_dir=args.out, capture_cores=args.cores, max_events_per_core=args.max_events,
                            device_profile=args.device_profile, profile_all_threads=args.all_threads,
                            **({"modes": modes} if modes else {}))
    except ValueError as e:
        print(f"tilescope profile: {e}", file=sys.stderr)
        return 2
    exporter = run_script(args.script, args.args, cfg, device=args.device)
    print(f"tilescope: profile written to {exporter.path}", file=sys.stderr)
    print(f"open it with: tilescope explore {exporter.path}", file=sys.stderr)
    return 0


def _cmd_doctor(args) -> int:
    from ._doctor import diagnose

    try:
        findings = diagnose(args.path)
    except (OSError, ValueError) as e:  # not a profile directory, unreadable files
        print(f"tilescope doctor: {e}", file=sys.stderr)
        return 2
    if not findings:
        print(f"{args.path}: no known profiling mistakes found")
        return 0
    for f in findings:
        print(f)
    return 1 if any(f.severity == "error" for f in findings) else 0


def _cmd_share(args) -> int:
    from ._share import share

    try:
        path = share(args.path, args.out, redact=args.redact, keep_sources=args.keep_sources)
    except (OSError, ValueError) as e:  # not a complete profile directory
        print(f"tilescope share: {e}", file=sys.stderr)
        return 2
    print(f"wrote {'redacted ' if args.redact else ''}copy to {path}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("profile", help="run a Python script under the profiler (no code change)")
    p.add_argument("--out", default="profile_out", help="output directory (default profile_out)")
    p.add_argument("--cores", default=None, help='cores to capture, e.g. "0,2-3" (default all)')
    p.add_argument("--mode", default=None, help="comma-separated modes: DEVICE,RUNTIME,HOST_CPU,HOST_MEMORY")
    p.add_argument("--max-events", type=int, default=1_000_000, help="instruction events kept per core")
    p.add_argument("--device", choices=("sim", "cuda", "cpu"), default="sim",
                   help="what the script runs on (default sim: the simulated device, registered first)")
    p.add_argument("--device-profile", choices=("first", "session"), default="first")
    p.add_argument("--all-threads", action="store_true",
                   help="record the ops of every thread (default: the main thread's; device work launched "
                        "from other threads then has no op)")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs="...", help="arguments for the script")
    p.set_defaults(func=_cmd_profile)
    d = sub.add_parser("doctor", help="check a profile directory for common profiling mistakes")
    d.add_argument("path")
    d.set_defaults(func=_cmd_doctor)
    s = sub.add_parser("share", help="copy a profile, redacting host names, paths, environment and stacks")
    s.add_argument("path")
    s.add_argument("--out", default="profile_shared", help="output directory (default profile_shared)")
    s.add_argument("--redact", action=__import__("argparse").BooleanOptionalAction, default=True)
    s.add_argument("--keep-sources", action="store_true",
                   help="keep the kernels' source text in a redacted copy (left out by default)")
    s.set_defaults(func=_cmd_share)
