"""Reading and writing the predictors' JSON documents (calibrations, tables)."""

from __future__ import annotations

import json
import os
from typing import Sequence


def save_document(doc: dict, path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, allow_nan=False)
        f.write("\n")


def load_document(path, *, kind: str, accepted: Sequence[int], what: str) -> dict:
    """The JSON object in `path`, checked to be a `kind` document of an `accepted`
    schema_version; errors name the file and what it should have been."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file {path!r} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON {what} ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise ValueError(f"{path}: expected a {kind} document")
    if doc.get("schema_version") not in accepted:
        raise ValueError(f"{path}: schema_version {doc.get('schema_version')!r}; this gnomon "
                         f"reads {tuple(accepted)}")
    return doc
