"""What `gnomon dash ...` runs once its arguments are parsed (the CLI holds no logic)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import sqlalchemy as sa

from gnomon.dash import comparison as compare_mod
from gnomon.dash import history, store
from gnomon.dash.store import DashError


def parse_threshold(text: str, what: str = "--threshold") -> float:
    """'5%' or '0.05' -> 0.05; anything else is refused."""
    raw = text.strip()
    try:
        if raw.endswith("%"):
            value = float(raw[:-1]) / 100
        else:
            value = float(raw)
            if value >= 1:
                raise DashError(f"{what} {text!r} is ambiguous: write a percentage such as "
                                "5% or a fraction such as 0.05")
    except ValueError:
        raise DashError(f"{what} {text!r} is not a percentage such as 5% or a fraction "
                        "such as 0.05") from None
    if not 0 < value < 1:
        raise DashError(f"{what} {text!r} must lie strictly between 0% and 100%")
    return value


def parse_op_thresholds(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        op, sep, value = item.partition("=")
        if not sep or not op.strip():
            raise DashError(f"--threshold-op {item!r} is not OP=THRESHOLD, e.g. "
                            "paged_attention=10%")
        out[op.strip()] = parse_threshold(value, f"--threshold-op {op.strip()}")
    return out


def run(args) -> int:  # noqa: ANN001 - argparse.Namespace
    from rich.console import Console

    # a log (not a terminal) gets wide lines so that benchmark keys stay whole
    console = Console(width=None if sys.stdout.isatty() else 160)
    command = args.dash_command
    thresholds = {}
    if command in ("compare", "history"):
        thresholds = {"threshold": parse_threshold(args.threshold),
                      "op_thresholds": parse_op_thresholds(args.threshold_op)}
    if command == "migrate":
        report = store.migrate(args.db, dry_run=args.dry_run)
        found = "empty" if report["found"] is None else f"schema version {report['found']}"
        print(f"database {report['url']}: {found}; this gnomon's is {report['target']}")
        verb = "would" if args.dry_run else "did"
        for change in report["changes"]:
            print(f"  {verb}: {change}")
        if not report["changes"]:
            print("  nothing to change")
        return 0
    engine = store.open_engine(args.db)
    try:
        if command == "ingest":
            counts = store.ingest(engine, args.files)
            print(f"ingested {counts['files']} file(s): {counts['runs_added']} run(s) added, "
                  f"{counts['runs_skipped']} already stored, {counts['results_added']} "
                  f"result(s); {counts['figures_added']} accuracy figure(s) added, "
                  f"{counts['figures_skipped']} already stored")
            return 0
        if command == "compare":
            result = compare_mod.compare(engine, args.base, args.head, args.machine,
                                         **thresholds)
            compare_mod.render_table(result, console)
            if args.markdown:
                try:
                    Path(args.markdown).write_text(compare_mod.to_markdown(result))
                except OSError as error:
                    raise DashError(f"--markdown {args.markdown!r}: cannot write: "
                                    f"{error.strerror or error}") from None
            return compare_mod.exit_code([row.verdict for row in [*result.rows, *result.accuracy]],
                                         args.allow_ambiguous)
        if command == "history":
            found = history.update_history(engine, **thresholds)
            history.render_history(found, console)
            with engine.connect() as conn:
                history.render_accuracy_steps(history.accuracy_steps(conn), console)
            return 0
        if command == "ack":
            count = history.ack(engine, args.key, args.reason)
            print(f"acknowledged {count} step(s) of {args.key}")
            return 0
        if command == "site":
            from gnomon.dash.export import site_data

            try:
                from gnomon.dash.site import write_site
            except ImportError as error:
                raise DashError(f"the site writer cannot be loaded: {error}") from None

            out = Path(args.out)
            if out.exists() and not out.is_dir():
                raise DashError(f"site output {os.fspath(out)!r} exists and is not a folder")
            write_site(site_data(engine), out)
            print(f"wrote the site to {out}/")
            return 0
        raise DashError(f"unknown dash command {command!r}")
    except sa.exc.DBAPIError as error:  # the server went away, or refused a statement
        raise store.StoreError(f"database {store.shown_url(engine.url)}: "
                               f"{' '.join(str(error.orig or error).split())}") from None
    finally:
        engine.dispose()
