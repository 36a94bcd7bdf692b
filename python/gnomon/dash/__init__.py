"""The kernel regression dashboard behind `gnomon dash`: a SQLAlchemy store of results files
(:mod:`gnomon.dash.store`), the statistics (:mod:`gnomon.dash.stats`), `compare`, `history`,
the data the static site draws (:func:`site_data`) and the site itself (:mod:`gnomon.dash.site`).

This layer sits after `gnomon.bench`; nothing in `gnomon.bench` imports it."""

from gnomon.dash.comparison import Comparison, compare
from gnomon.dash.export import site_data
from gnomon.dash.history import ack, detect, update_history
from gnomon.dash.stats import judge
from gnomon.dash.store import DashError, StoreError, ingest, open_engine

__all__ = ["Comparison", "DashError", "StoreError", "ack", "compare", "detect", "ingest",
           "judge", "open_engine", "site_data", "update_history"]
