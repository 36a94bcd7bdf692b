"""The `gnomon` command. It parses arguments and prints; the work lives in the library."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def build_summary() -> dict:
    from gnomon import _C

    info = _C.build_info()
    try:  # the thread count the kernels use follows torch's unless pinned
        from gnomon.ops import num_threads
    except ImportError:
        num_threads = _C.num_threads
    info["num_threads"] = num_threads()
    return info


def _print_info(as_json: bool) -> None:
    info = build_summary()
    if as_json:
        print(json.dumps(info, indent=2))
        return
    sanitizers = ", ".join(info["sanitizers"]) or "none"
    print(f"gnomon {info['version']}")
    print(f"compiler:     {info['compiler']}")
    print(f"build:        {info['build_type']} ({info['cxx_flags']}); sanitizers: {sanitizers}")
    print(f"simd:         compiled for {info['simd_compiled']}; "
          f"this cpu has {', '.join(info['simd_cpu']) or 'none detected'}")
    print(f"gpu backends: {', '.join(info['gpu_backends']) or 'none (CPU-only build)'}")
    print(f"threads:      {info['num_threads']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gnomon", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="what this build of gnomon holds")
    info.add_argument("--json", action="store_true", help="print the build summary as JSON")

    args = parser.parse_args(argv)
    if args.command == "info":
        _print_info(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
