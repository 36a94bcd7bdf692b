"""`gnomon.documents`: the one contract of result documents, and the readers built on it."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from gnomon import documents
from gnomon.documents import DocumentError

KIND = "gnomon.test.thing"


def _doc(**fields):
    return {"schema_version": 1, "kind": KIND, "value": 1.5, **fields}


def test_dump_then_load_round_trips(tmp_path):
    doc = _doc(nested={"list": [1, 2.5, None, "x"]})
    path = tmp_path / "a.json"
    documents.dump(doc, path)
    assert documents.load(path, KIND, (1,)) == doc
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_dump_is_atomic_and_leaves_nothing_behind_on_failure(tmp_path):
    path = tmp_path / "a.json"
    documents.dump(_doc(), path)
    before = path.read_text()
    with pytest.raises(DocumentError, match=r"a.json: the document is not JSON-ready"):
        documents.dump(_doc(value=object()), path)
    assert path.read_text() == before  # the old file, whole
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary left


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_are_refused_by_their_field(tmp_path, bad):
    path = tmp_path / "a.json"
    with pytest.raises(DocumentError, match=r"a.json: runs\[1\].median is not a finite number"):
        documents.dump(_doc(runs=[{"median": 1.0}, {"median": bad}]), path)
    assert not path.exists()
    # a file someone else wrote with NaN (Python's json writes it unless told not to)
    path.write_text(json.dumps(_doc(runs=[{"median": 1.0}, {"median": bad}])))
    with pytest.raises(DocumentError, match=r"runs\[1\].median is not a finite number"):
        documents.load(path, KIND, (1,))


@pytest.mark.parametrize("text,message", [
    ("", "not valid JSON"),
    ('{"schema_version": 1, "kind"', r"not valid JSON \(truncated\?\).*gnomon.test.thing"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps(_doc(schema_version=2)), r"schema_version 2 is not one this gnomon reads for "
                                         r"gnomon.test.thing \(accepted: 1\)"),
    (json.dumps(_doc(schema_version=True)), "schema_version True"),
    (json.dumps(_doc(kind="gnomon.other")), "kind 'gnomon.other'; expected a gnomon.test.thing"),
])
def test_load_names_the_file_and_what_was_expected(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(DocumentError, match=message) as info:
        documents.load(path, KIND, (1,))
    assert str(info.value).startswith(f"{path}: ")


def test_a_missing_file_is_a_document_error(tmp_path):
    with pytest.raises(DocumentError, match="missing.json: cannot read a gnomon.test.thing"):
        documents.load(tmp_path / "missing.json", KIND, (1,))
    assert issubclass(DocumentError, ValueError)


def test_dump_into_a_missing_folder_says_so(tmp_path):
    with pytest.raises(DocumentError, match="cannot write in"):
        documents.dump(_doc(), tmp_path / "no" / "a.json")
    with pytest.raises(DocumentError, match="needs a kind and a schema_version"):
        documents.dump({"value": 1}, tmp_path / "a.json")


def test_check_fields_names_the_field_and_its_type():
    fields = {"count": int, "median": (int, float), "name": (str, type(None))}
    documents.check_fields({"count": 1, "median": 2.5, "name": None}, fields, "row", "f.json")
    for obj, message in [
        ({"median": 1.0, "name": None}, r"f.json: row lacks the field 'count' \(an integer\)"),
        ({"count": True, "median": 1.0, "name": None}, r"row.count is bool; expected an integer"),
        ({"count": 1, "median": "x", "name": None}, r"row.median is str; expected an integer "
                                                    r"or a number"),
        ([], "row must be an object, got list"),
    ]:
        with pytest.raises(DocumentError, match=message):
            documents.check_fields(obj, fields, "row", "f.json")


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5)
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(JSONISH)
def test_a_document_round_trips_exactly_when_all_its_numbers_are_finite(tmp_path_factory,
                                                                          value):
    path = tmp_path_factory.mktemp("doc") / "a.json"
    doc = _doc(payload=value)

    def all_finite(v):
        if isinstance(v, float):
            return v == v and v not in (float("inf"), -float("inf"))
        if isinstance(v, dict):
            return all(all_finite(x) for x in v.values())
        return all(all_finite(x) for x in v) if isinstance(v, list) else True

    finite = all_finite(value)
    try:
        documents.dump(doc, path)
    except DocumentError as error:
        assert not finite and "payload" in str(error)
        return
    assert finite and documents.load(path, KIND, (1,)) == doc


def test_the_module_imports_nothing_heavy():
    probe = ("import sys, gnomon.documents; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'numpy', 'sqlalchemy')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_every_document_reader_raises_the_one_error(tmp_path):
    from gnomon.bench import results
    from gnomon.dash.site import validate_site_data
    from gnomon.predict import report
    from gnomon.predict.calibrated import CalibratedPredictor
    from gnomon.predict.table import TablePredictor

    bad = tmp_path / "bad.json"
    bad.write_text("{")
    for read in (results.load, report.load, CalibratedPredictor.load, TablePredictor.load):
        with pytest.raises(DocumentError, match="bad.json: not valid JSON"):
            read(bad)
    with pytest.raises(DocumentError, match="site data: the data lacks the field 'machines'"):
        validate_site_data({})
