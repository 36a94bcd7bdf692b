"""Result documents: the one contract of every JSON file gnomon writes for another run to read
(bench results, simulation reports and sweeps, calibrations, tables, validation reports, the
dashboard site's data).

A document is a JSON object with a ``kind`` (``"gnomon.bench.results"``, ...) and an integer
``schema_version``. Renaming or removing a field is a major version bump, and a reader names
the versions it accepts. Every number in a document is finite: JSON has no NaN or infinity,
and a value that does not exist is null. `dump` writes atomically (a temporary file in the same
folder, renamed into place), so a reader never sees half a file. Every problem raises
`DocumentError`, whose message names the file, the field and what was expected.

This module sits at the lowest layer: it imports nothing of gnomon's, and no torch.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

Kinds = Union[type, Tuple[type, ...]]


class DocumentError(ValueError):
    """A document that cannot be read or written: names the file, the field and what was
    expected."""


def _type_names(kind: Kinds) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object", bool: "true or false", type(None): "null"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _non_finite(value: Any, where: str) -> Optional[str]:
    """The path of the first NaN or infinity in `value`, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, item in items:
        found = _non_finite(item, path)
        if found is not None:
            return found
    return None


def check_finite(doc: Any, source: str) -> None:
    """Raises DocumentError naming the first field of `doc` that holds NaN or infinity."""
    where = _non_finite(doc, "")
    if where is not None:
        raise DocumentError(f"{source}: {where or 'the document'} is not a finite number; "
                            "expected a finite number (null where a value does not exist)")


def check_fields(obj: Any, fields: Mapping[str, Kinds], where: str, source: str) -> None:
    """`obj` is an object holding each of `fields` with a value of its type(s); a bool never
    counts as a number (`check_finite` checks the numbers)."""
    if not isinstance(obj, dict):
        raise DocumentError(f"{source}: {where} must be an object, got {type(obj).__name__}")
    for name, kind in fields.items():
        if name not in obj:
            raise DocumentError(f"{source}: {where} lacks the field {name!r} "
                                f"({_type_names(kind)})")
        value = obj[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            raise DocumentError(f"{source}: {where}.{name} is {type(value).__name__}; "
                                f"expected {_type_names(kind)}")


def check_header(doc: Any, kind: str, accepted_versions: Sequence[int], source: str) -> dict:
    """`doc` is an object of `kind` at one of `accepted_versions`; returns it."""
    return check_kind(doc, {kind: accepted_versions}, source)


def check_kind(doc: Any, accepted: Mapping[str, Sequence[int]], source: str) -> dict:
    """`doc` is an object of one of the kinds in `accepted` (kind -> accepted versions), at a
    version accepted for its kind; returns it."""
    kinds = " or ".join(accepted)
    if not isinstance(doc, dict):
        raise DocumentError(f"{source}: expected a JSON object (a {kinds} document), got "
                            f"{type(doc).__name__}")
    kind = doc.get("kind")
    if kind not in accepted:
        raise DocumentError(f"{source}: kind {kind!r}; expected a {kinds} document")
    version = doc.get("schema_version")
    if isinstance(version, bool) or version not in accepted[kind]:
        raise DocumentError(f"{source}: schema_version {version!r} is not one this gnomon "
                            f"reads for {kind} (accepted: "
                            f"{', '.join(map(str, accepted[kind]))})")
    return doc


def load(path: Union[str, os.PathLike], kind: str, accepted_versions: Sequence[int]) -> dict:
    """The `kind` document in `path`, of one of `accepted_versions`, every number finite.
    DocumentError for a missing, unreadable, truncated, wrong-kind or unknown-version file.
    The caller checks the fields of its kind."""
    return load_any(path, {kind: accepted_versions})


def load_any(path: Union[str, os.PathLike], accepted: Mapping[str, Sequence[int]]) -> dict:
    """`load` for a file that may hold any of the kinds in `accepted` (kind -> versions)."""
    source, kinds = os.fspath(path), " or ".join(accepted)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise DocumentError(f"{source}: cannot read a {kinds} document: {reason}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise DocumentError(f"{source}: not valid JSON (truncated?): {error}; expected a "
                            f"{kinds} document") from None
    check_kind(doc, accepted, source)
    check_finite(doc, source)
    return doc


def dump(doc: Mapping[str, Any], path: Union[str, os.PathLike]) -> None:
    """Writes `doc` as JSON to `path` atomically. DocumentError for a value that is not JSON
    (NaN or infinity included) or a folder that cannot be written."""
    path = Path(path)
    source = os.fspath(path)
    if not isinstance(doc, Mapping) or "kind" not in doc or "schema_version" not in doc:
        raise DocumentError(f"{source}: a document needs a kind and a schema_version")
    check_finite(dict(doc), source)
    try:
        text = json.dumps(doc, indent=1, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise DocumentError(f"{source}: the document is not JSON-ready: {error}") from None
    folder = path.resolve().parent
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    except OSError as error:
        raise DocumentError(f"{source}: cannot write in {folder}: "
                            f"{error.strerror or error}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
