"""Acceptance of the rule advisor with the real engine: agent sessions with the usual client habits (a request id and
the time at the top of the system prompt, tools in another order and key order on every call, CRLF in some user
turns, a growing conversation; 3 sessions x 6 turns) replayed through the gateway.

The tenant with the default rules (and the default `advice_sample_rate`: the advisor samples every request while it
has capacity) is advised to turn on `hoist_volatile` after its first 18 requests (at most 20), with an estimated token
hit rate within 10 points of what a tenant with that setting then measures on the same kind of traffic; a tenant
whose traffic has nothing volatile is advised nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from real_engine_kit import MODEL, keyed_gateway, stored
from sqlalchemy import create_engine

from db.queries.advice import advice
from db.timeutil import utc_now
from gateway.advisor.traffic import interleaved_sessions
from gateway.config import SEMANTIC_RULES, TenantSettings

pytestmark = pytest.mark.real_model

SESSIONS, TURNS = 3, 6
ADVISED = TenantSettings(uplift_sample_rate=0.0)  # the default advice_sample_rate
assert 0 < ADVISED.advice_sample_rate < 1 and SESSIONS * TURNS <= 20
HOISTED = {
    placement: TenantSettings(
        rules=frozenset({*SEMANTIC_RULES, "hoist_volatile"}),
        hoist_placement=placement,
        uplift_sample_rate=0.0,
        advice_sample_rate=0.0,
    )
    for placement in ("after_system", "end")
}


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]
    database_url: str

    def replay(self, tenant: str, *, volatile: bool, seed: int) -> list[dict[str, Any]]:
        """Send the sessions' calls in turn; returns the stored rows in order."""
        ids = []
        headers = {"authorization": f"Bearer {self.keys[tenant]}"}
        for _, _, body in interleaved_sessions(SESSIONS, TURNS, volatile=volatile, seed=seed):
            payload = {"model": MODEL, **body, "max_tokens": 1, "temperature": 0}
            response = httpx.post(f"{self.url}/v1/chat/completions", json=payload, headers=headers, timeout=300)
            assert response.status_code == 200, response.text
            ids.append(response.headers["x-request-id"])
        rows = stored(self.database_url, "requests", "id", ids)
        return [rows[i] for i in ids]

    def advice(self, tenant: str) -> Any:
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                (found,) = advice(conn, utc_now() - timedelta(days=1), tenant=tenant)
        finally:
            engine.dispose()
        return found


def token_hit_rate(rows: list[dict[str, Any]]) -> float:
    return sum(row["cached_tokens"] for row in rows) / sum(row["prompt_tokens"] for row in rows)


@pytest.fixture(scope="module")
def deployment(engine_url: str, tmp_path_factory) -> Iterator[Deployment]:
    tenants = {"agents": ADVISED, "steady": ADVISED} | {f"hoisted_{p}": s for p, s in HOISTED.items()}
    with keyed_gateway(engine_url, tmp_path_factory.mktemp("advisor"), tenants) as (url, keys, database_url):
        yield Deployment(url, keys, database_url)


def test_default_rules_tenant_is_advised_hoist_volatile_and_the_estimate_holds(deployment: Deployment) -> None:
    rows = deployment.replay("agents", volatile=True, seed=1)
    found = deployment.advice("agents")
    assert found.token_hit_rate == pytest.approx(token_hit_rate(rows))
    by_key = {c.candidate: c for c in found.candidates}
    assert set(by_key) == {"hoist_volatile:after_system", "hoist_volatile:end"}
    for candidate in by_key.values():
        assert candidate.samples == SESSIONS * TURNS
        assert candidate.changed_samples == SESSIONS * TURNS
        assert candidate.shown and candidate.moves_content
    (best,) = found.recommendations  # the placements exclude each other: only the better one is recommended
    assert best.candidate.startswith("hoist_volatile:")
    placement = best.candidate.split(":")[1]
    lines = ("[tenants.agents]", "rules = { hoist_volatile = true }", f'hoist_placement = "{placement}"')
    assert best.toml_lines == lines
    assert best.tokens_saved_per_day > 0

    measured = {}
    for key, candidate in by_key.items():
        tenant = "hoisted_" + key.split(":")[1]
        measured[key] = token_hit_rate(deployment.replay(tenant, volatile=True, seed=2))
        assert candidate.estimated_hit_rate is not None
        assert abs(candidate.estimated_hit_rate - measured[key]) <= 0.10, (key, candidate, measured[key])
    assert measured[best.candidate] >= found.token_hit_rate + 0.2, (measured, found.token_hit_rate)


def test_tenant_with_nothing_volatile_is_advised_nothing(deployment: Deployment) -> None:
    rows = deployment.replay("steady", volatile=False, seed=3)
    found = deployment.advice("steady")
    assert found.recommendations == ()
    for candidate in found.candidates:
        assert candidate.samples == SESSIONS * TURNS
        assert candidate.changed_samples == 0
        assert candidate.estimated_hit_rate == pytest.approx(token_hit_rate(rows))
