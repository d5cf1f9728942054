"""Debug entry point: run a command exactly as the tools do, and show the result.

    python -m sandbox run --workspace DIR [--timeout S] [--stdin TEXT] -- CMD [ARG ...]

Prints the result's fields, then stdout and stderr; exits with the command's
return code (128 + N for signal N), or 2 when the sandbox is unavailable.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from sandbox.paths import Workspace
from sandbox.process import Limits, Sandbox, SandboxUnavailable


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sandbox")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run CMD in the sandbox, as the tools do")
    run.add_argument("--workspace", type=Path, required=True,
                     help="the workspace folder (created if missing), seen as /workspace")
    run.add_argument("--timeout", type=float, default=None, help="seconds (default: Limits)")
    run.add_argument("--stdin", default=None, help="text to send on standard input")
    run.add_argument("--allow-unsandboxed", action="store_true",
                     help="run without bwrap when it is missing (unsafe)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("nothing to run: give the command after --, e.g. -- python3 -c 'print(1)'",
              file=sys.stderr)
        return 2
    sandbox = Sandbox(allow_unsandboxed=args.allow_unsandboxed, limits=Limits())
    try:
        result = sandbox.run_sync(cmd, Workspace(args.workspace), stdin=args.stdin,
                                  timeout_s=args.timeout)
    except SandboxUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    for f in dataclasses.fields(result):
        if f.name not in ("stdout", "stderr"):
            print(f"{f.name}: {getattr(result, f.name)}")
    for name in ("stdout", "stderr"):
        text = getattr(result, name)
        print(f"--- {name} ({len(text)} chars) ---")
        print(text, end="" if text.endswith("\n") or not text else "\n")
    return min(result.returncode, 255)


if __name__ == "__main__":
    sys.exit(main())
