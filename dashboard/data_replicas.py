"""The Replicas page's data: hit rate and load per replica over time, and the router's accuracy
(`db.queries.replicas`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import streamlit as st
from sqlalchemy import Connection

from dashboard.data import LIVE_TTL_S, _read
from dashboard.loaders import bucket_for_span
from db.queries.replicas import replica_history, router_accuracy
from db.queries.results_replicas import ReplicaBucket, RouterAccuracy


@dataclass(frozen=True)
class ReplicasData:
    bucket: str
    history: list[ReplicaBucket]
    accuracy: list[RouterAccuracy]


def load_replicas(conn: Connection, since: datetime, until: datetime) -> ReplicasData:
    bucket = bucket_for_span(until - since)
    return ReplicasData(bucket, replica_history(conn, since, until, bucket), router_accuracy(conn, since, until))


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False)
def replicas(url: str, since: datetime, until: datetime) -> ReplicasData:
    return _read(url, load_replicas, since, until)
