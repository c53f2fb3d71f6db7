"""Demo history is what the gateway records: the same requests sent through the running gateway (keys, proxy,
adapters, recorder) to an engine answering from the same simulated cache give the same records, field by field
(conversations, turns and token ledgers included); and
the demo's names (rules, reasons, miss kinds, segments, request-id, model and upstream formats) are the gateway's."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from gateway_testkit import FakeStorage, gateway_config, running_gateway, serve_in_thread

from db.ledger import LOST_CAUSES, TokenLedger, lost_field
from db.records import MISS_KINDS, MISS_REASONS
from gateway.config import UpstreamConfig
from gateway.config.tenant import ALL_RULES
from gateway.demo.engine_model import SimulatedEngine, local_engine_response, render
from gateway.demo.history import replay_pool
from gateway.demo.replay import HOST_TIER_PAGES, LOCAL_MODEL, LOCAL_UPSTREAM, UPSTREAM_KINDS, UPSTREAMS, Replay
from gateway.demo.traffic import TENANTS
from gateway.explain.reasons import REASONS
from gateway.explain.segments import chat_segments

MODEL = LOCAL_MODEL
UPSTREAM = LOCAL_UPSTREAM
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
# Everything a record says about a request that does not depend on the clock or the request id.
COMPARED = (
    "tenant", "endpoint", "model", "upstream", "stream", "status_code", "error_type", "prompt_tokens", "cached_tokens",
    "miss_kind", "applied_rules", "prefix_hash", "prompt_text", "miss_reason", "divergence_segment",
    "divergence_char_offset", "recomputed_tokens", "divergence_source", "diverged_at_token", "template_tokens",
    "namespace_label", "chain", "hash_key_version", "cached_tokens_device", "cached_tokens_host", "cached_tokens_disk",
    "cache_load_ms", "conversation_source", "turn_index", "answer_rewrite", "new_tokens", "unknown_tokens",
    *(lost_field(cause) for cause in LOST_CAUSES),
)


class SimulatedEngineServer:
    """The local engine's HTTP surface over the demo's simulated cache: the same cache size (device and host tier)
    and clock as the demo's local upstream."""

    def __init__(self) -> None:
        _, pages, ttl = UPSTREAM_KINDS[UPSTREAM]
        self.engine = SimulatedEngine(pages, ttl, HOST_TIER_PAGES[UPSTREAM])
        self.clock = 0.0
        # The assistant message of the next answer: what the demo's client re-sends in its next turn, as a client
        # re-sends the answer it got (else the gateway records the turn's answer as rewritten).
        self.reply: dict[str, Any] = {"role": "assistant", "content": "ok"}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.loads(b"".join(chunks))
        self.clock += 2.0
        rendered = render(f"{UPSTREAM}/{body['model']}/{body['cache_salt']}", chat_segments(body))
        match = self.engine.serve(rendered, self.clock)
        headers, fields = local_engine_response(match, 3, 5.0, body.get("return_hash_chain") is True)
        answer = {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": self.reply, "finish_reason": "stop"}],
            **fields,
        }
        raw_headers = [(b"content-type", b"application/json")]
        raw_headers += [(name.encode(), value.encode()) for name, value in headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": raw_headers})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})


def _replies(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each request, the assistant message that a later request of its conversation sends right after its last
    message (the answer the client got; earlier messages may have been edited since), else a plain `ok`."""
    replies = []
    for index, body in enumerate(bodies):
        messages = body.get("messages") or []
        reply = {"role": "assistant", "content": "ok"}
        for later in bodies[index + 1:]:
            following = later.get("messages") or []
            if messages and len(following) > len(messages) and following[len(messages) - 1] == messages[-1]:
                if following[len(messages)].get("role") == "assistant":
                    reply = following[len(messages)]
                    break
        replies.append(reply)
    return replies


def _conversation_shape(records: list[Any]) -> list[tuple[int | None, int | None]]:
    """Per record, in order: the position of its conversation's first record and of its parent (None: none)."""
    position = {record.request_id: index for index, record in enumerate(records)}
    first: dict[str | None, int] = {}
    shape = []
    for index, record in enumerate(records):
        opened = None if record.conversation_id is None else first.setdefault(record.conversation_id, index)
        shape.append((opened, position.get(record.parent_request_id)))
    return shape


def test_demo_records_equal_the_running_gateway_s_for_the_same_requests() -> None:
    seed = 11
    demo = Replay(seed)
    chat_tenants = [profile for profile in TENANTS if profile.endpoint == "chat.completions"]
    requests = []
    for index in range(120):
        profile = chat_tenants[index % len(chat_tenants)]
        requests.append((profile, dict(demo.traffic.request(profile, MODEL, NOW + timedelta(seconds=index)))))

    storage = FakeStorage()
    keys = {profile.name: storage.add_key(f"{n:012x}", profile.name) for n, profile in enumerate(chat_tenants)}
    server = SimulatedEngineServer()
    with serve_in_thread(server) as engine_url:
        config = gateway_config(
            engine_url,
            upstreams=(UpstreamConfig(name=UPSTREAM, url=engine_url, kind="local_engine", timeout_s=30.0),),
            default_upstream=UPSTREAM,
            server_secret=demo.secret,
            auth="keys",
            tenants={
                profile.name: replace(profile.settings, uplift_sample_rate=0.0, advice_sample_rate=0.0)
                for profile in TENANTS
            },
        )
        with running_gateway(config, storage) as gw:
            replies = _replies([body for _, body in requests])
            for (profile, body), reply in zip(requests, replies, strict=True):
                server.reply = reply  # requests go one at a time
                response = httpx.post(f"{gw.url}/v1/chat/completions", json=body,
                                      headers={"authorization": f"Bearer {keys[profile.name]}"}, timeout=30)
                assert response.status_code == 200, response.text
            recorded = gw.wait_records(len(requests))
    assert len(recorded) == len(requests)

    for index, (profile, body) in enumerate(requests):
        demo.handle(profile, body, UPSTREAM, f"req_{index:024x}", NOW)
    demo_records = demo.take()
    for ours, theirs in zip(demo_records, recorded, strict=True):
        assert re.fullmatch(r"req_[0-9a-f]{24}", theirs.request_id)
        assert {name: getattr(ours, name) for name in COMPARED} == {name: getattr(theirs, name) for name in COMPARED}, (
            theirs.tenant, theirs.answer_rewrite, theirs.answer_rewrite_segment, theirs.answer_rewrite_char_offset)
    # The same conversations: the same first turn and parent of every request (ids differ: the gateway draws its own).
    assert _conversation_shape(demo_records) == _conversation_shape(recorded)
    assert max(record.turn_index or 0 for record in recorded) >= 3
    assert any(sum(TokenLedger.of(record).lost.values()) > 0 for record in recorded)
    # The engine's tier split came through the proxy: some of the hits were loaded back from the host tier.
    assert all(record.cached_tokens_device is not None for record in recorded)
    assert any((record.cached_tokens_host or 0) > 0 and (record.cache_load_ms or 0) > 0 for record in recorded)
    reasons = {record.miss_reason for record in recorded}
    # The trial covers the kinds the demo is about: reuse, edits, volatile values, reordered tools, new prompts.
    assert {"hit", "volatile_value", "new_prefix"} <= reasons
    assert {rule for record in recorded for rule in record.applied_rules} == {"newlines", "tool_schema_key_order"}


def test_demo_names_are_the_gateway_s_and_lost_tokens_are_counted() -> None:
    stamps = [NOW + timedelta(seconds=30 * index) for index in range(1500)]
    records = replay_pool(5, stamps, [f"req_{index:024x}" for index in range(1500)])
    assert {rule for record in records for rule in record.applied_rules} <= set(ALL_RULES)
    assert {record.miss_reason for record in records} - {None} <= set(REASONS) <= set(MISS_REASONS)
    assert {record.miss_kind for record in records} - {None} <= set(MISS_KINDS)
    assert {record.model for record in records} == set(UPSTREAMS)
    assert all(record.upstream in UPSTREAMS[record.model] for record in records)
    segments = {record.divergence_segment for record in records} - {None}
    assert all(re.fullmatch(r"model|tools|system|prompt|messages\[\d+\]", segment) for segment in segments)
    for record in records:
        if record.miss_reason not in (None, "hit") and record.cached_tokens is not None:
            # Every reason but a hit lost tokens, as many as the engine did not serve from cache.
            assert record.recomputed_tokens == record.prompt_tokens - record.cached_tokens > 0, record
        if record.miss_reason == "new_prefix" and record.cached_tokens is not None:
            assert record.cached_tokens <= (record.template_tokens or 0)
