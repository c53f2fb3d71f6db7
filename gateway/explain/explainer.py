"""Per request: segments and the nearest earlier request when it is sent; the reason, the divergence, the hash chain
and (for a sample) a normalization uplift check once it has been answered. When the engine reports where its match
ended, the divergence is the engine's (`located`); otherwise it is approximated from the history (`reasons`).

The lookup happens when the request goes upstream (scheduled to run while the upstream works), so that it sees the
tenant's history as the engine's cache saw it: requests still in flight are not yet in either. The request joins the
history once it has been answered. Everything here runs on the event loop, after the response or while waiting for
the upstream; nothing delays the client's bytes.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, replace
from typing import Any, Protocol

from db.chains import RequestChain
from db.ledger import TokenLedger
from gateway.config.tenant import TenantSettings
from gateway.conversations.link import ConversationLink
from gateway.explain.chains import approximate_chain, canonical_prompt_text, engine_chain
from gateway.explain.compare import compare
from gateway.explain.history import HistoryIndex, Nearest
from gateway.explain.ledger import (
    CONTENT_CAUSES,
    Routing,
    changed_segment_unsent,
    evicted_tier,
    first_changed_segment,
    sent_before_segment,
    token_ledger,
    withheld_by_api,
)
from gateway.explain.located import ENGINE, engine_locates, explain_located
from gateway.explain.reasons import BELOW_PAGE, CACHE_SCOPE, HIT, REORDERED, ROUTED_AWAY, Explanation, classify
from gateway.explain.segments import PromptSegments, chat_segments, completion_segments
from gateway.explain.uplift import UpliftChecker, UpliftJob
from gateway.parsing import CHAT
from gateway.upstreams.base import CacheReport
from gateway.upstreams.route import Route
from gateway.upstreams.tiers import TierSplit

log = logging.getLogger(__name__)


class ExplainContext:
    """What the explainer needs to know about one request, filled in along the request path."""

    __slots__ = (
        "settings",
        "endpoint",
        "tenant",
        "body",
        "raw_body",
        "salt",
        "route",
        "client_wants_chain",
        "segments",
        "nearest",
        "prepared",
        "upstream_status",
        "prefix_cache",
        "request_id",
        "explicit_id",
        "answer",
        "conversation",
        "replica",
        "computed_tokens",
    )

    def __init__(
        self,
        settings: TenantSettings,
        endpoint: str,
        tenant: str,
        body: dict[str, Any],
        raw_body: dict[str, Any],
        salt: str,
        route: Route,
        client_wants_chain: bool,
        *,
        explicit_id: Any = None,
    ) -> None:
        self.settings = settings
        self.endpoint = endpoint
        self.tenant = tenant
        self.body = body  # the normalized request, as the upstream got it (less the salt)
        self.raw_body = raw_body  # the request as the client sent it
        self.salt = salt
        self.route = route
        self.client_wants_chain = client_wants_chain
        self.segments: PromptSegments | None = None
        self.nearest: Nearest | None = None
        self.prepared = False
        self.upstream_status: int | None = None  # set when the upstream's response headers arrive
        self.prefix_cache: dict[str, Any] | None = None  # the engine's `prefix_cache` object, when it sent one
        # For the conversation tracker (`gateway.conversations`): the request's id (set by its tracker), the
        # conversation id the client gave (`ExplicitId`), the answer as captured by the relay (`AnswerCapture`) and
        # the link found when the request went upstream.
        self.request_id: str | None = None
        self.explicit_id = explicit_id
        self.answer: Any = None
        self.conversation: Any = None
        # Set when the request is finished: the replica that answered it (None: not a replica set) and the tokens it
        # computed there (prompt and answer), which a later turn sent to another replica did not find.
        self.replica: str | None = None
        self.computed_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Explained:
    """The explanation of one answered request, its token ledger, its hash chain, and the uplift check to run (if
    sampled)."""

    explanation: Explanation | None = None
    chain: RequestChain | None = None
    normalization_gain_tokens: int | None = None
    uplift: UpliftJob | None = None
    ledger: TokenLedger | None = None
    evicted_tier: str | None = None

    def record_fields(self, report: CacheReport) -> dict[str, Any]:
        """The `RequestRecord` fields this fills, the hash chain aside (the recorder keys it); `report` is the
        engine's own report (`diverged_at_token` is its matched tokens when it located the divergence). The ledger
        fields only when there is a ledger."""
        ledger = {} if self.ledger is None else {**self.ledger.record_fields(), "evicted_tier": self.evicted_tier}
        explanation = self.explanation
        if explanation is None:
            return {"normalization_gain_tokens": self.normalization_gain_tokens, **ledger}
        located = explanation.segment is not None
        return {
            **ledger,
            "miss_reason": explanation.reason,
            "divergence_segment": explanation.segment,
            "divergence_char_offset": explanation.char_offset,
            "recomputed_tokens": explanation.recomputed_tokens,
            "divergence_source": explanation.source if located else None,
            "diverged_at_token": report.matched_tokens if located and explanation.source == "engine" else None,
            "normalization_gain_tokens": self.normalization_gain_tokens,
        }


class ConversationLinker(Protocol):
    """Links requests into conversations (`gateway.conversations.ConversationTracker`)."""

    def prepare(self, context: ExplainContext) -> None: ...

    def finish(self, context: ExplainContext, *, answered: bool) -> ConversationLink | None: ...


class Explainer:
    """Holds every tenant's request history, the uplift checker and the conversation tracker (None: requests are not
    linked into conversations)."""

    def __init__(
        self,
        uplift: UpliftChecker,
        *,
        rng: random.Random | None = None,
        conversations: ConversationLinker | None = None,
    ) -> None:
        self.histories = HistoryIndex()
        self.uplift = uplift
        self.conversations = conversations
        self._random = rng or random.Random()

    def prepare_soon(self, context: ExplainContext) -> None:
        """Schedule `prepare` to run while the upstream works on the request."""
        asyncio.get_running_loop().call_soon(self.prepare, context)

    def prepare(self, context: ExplainContext) -> None:
        """Segment the request and find the nearest earlier one (once; idempotent)."""
        if context.prepared:
            return
        context.prepared = True
        try:
            segment = chat_segments if context.endpoint == CHAT else completion_segments
            context.segments = segment(context.body)
            history = self.histories.for_tenant(context.tenant, context.settings.explain_history_size)
            context.nearest = history.nearest(context.segments)
        except Exception:  # explaining is an extra: it must never fail a request
            log.exception("could not segment a request for the miss explanation")
            context.segments = None
        if self.conversations is not None:
            try:
                self.conversations.prepare(context)
            except Exception:
                log.exception("could not link a request to its conversation")

    def conversation(self, context: ExplainContext, *, recorded_status: int) -> ConversationLink | None:
        """The request's place in its conversation, once it is finished, remembered for the turns that follow it.
        None: not linked, or not a turn: only a request the upstream answered with a 2xx that went on to the client
        (`recorded_status` 2xx too) is a conversation turn."""
        if self.conversations is None:
            return None
        self.prepare(context)
        answered = _is_2xx(context.upstream_status) and _is_2xx(recorded_status)
        try:
            return self.conversations.finish(context, answered=answered)
        except Exception:
            log.exception("could not link a request to its conversation")
            return None

    def explain(
        self,
        context: ExplainContext,
        *,
        recorded_status: int,
        engine: CacheReport,
        applied_rules: tuple[str, ...],
        conversation: ConversationLink | None = None,
        routing: Routing | None = None,
        tiers: TierSplit | None = None,
        withheld_tokens: int = 0,
    ) -> Explained:
        """Classify an answered request, account for its prompt tokens (`gateway.explain.ledger`) and remember it;
        nothing for a request the upstream did not answer. `conversation`: where the request stands in its
        conversation (`gateway.conversations`); `routing`: the replica set's predictions; `tiers`: the matched
        tokens' split when the response body gave it; `withheld_tokens`: of the engine's matched tokens, those the
        client's API did not report as read (`gateway.explain.ledger.withheld_by_api`)."""
        status = context.upstream_status
        if status is None or status >= 400:
            return Explained()
        try:
            explained = self._explain(context, recorded_status, engine, applied_rules, conversation)
            segments = None if context.segments is None else context.segments.segments
            names = None if segments is None else [segment.name for segment in segments]
            sent, unsent = None, 0
            if segments is not None and context.nearest is not None:
                sent = sent_before_segment([segment.digest for segment in segments], context.nearest.entry.digests)
                unsent = self._unsent(context, engine, explained.explanation)
            ledger = token_ledger(engine, explained.explanation, tiers=tiers, conversation=conversation,
                                  routing=routing, segment_names=names, sent_before_segment=sent,
                                  unsent_tokens=unsent)
            explanation = explained.explanation
            if ledger is not None and explanation is not None and ledger.lost.get(ROUTED_AWAY):
                # Another replica held what this one lacked: that, not what this replica's history says, is why.
                explanation = replace(explanation, reason=ROUTED_AWAY)
            if ledger is not None and withheld_tokens > 0:
                ledger = withheld_by_api(ledger, withheld_tokens, tiers)
                if explanation is not None and explanation.reason in (HIT, BELOW_PAGE) \
                        and withheld_tokens > (ledger.cached_tokens or 0):
                    # The engine served what it could; the API's cache rules are why the client read less (most of
                    # it: a few tokens past the last breakpoint leave the hit a hit).
                    explanation = Explanation(CACHE_SCOPE, recomputed_tokens=withheld_tokens, source=ENGINE)
            return replace(explained, explanation=explanation, ledger=ledger, evicted_tier=evicted_tier(engine, ledger))
        except Exception:
            log.exception("could not explain a request")
            return Explained()

    def _unsent(self, context: ExplainContext, engine: CacheReport, explanation: Explanation | None) -> int:
        """The tokens of the segment whose content changed that the nearest earlier request's version of it did not
        have (`changed_segment_unsent`); 0 when no content changed, or the same content was reordered."""
        if explanation is None or explanation.reason not in CONTENT_CAUSES or explanation.reason == REORDERED:
            return 0
        segments, earlier = context.segments.segments, context.nearest.entry.digests
        index = first_changed_segment([segment.digest for segment in segments], earlier)
        if index is None:
            return 0
        history = self.histories.for_tenant(context.tenant, context.settings.explain_history_size)
        earlier_text = history.text(earlier[index])
        if earlier_text is None:
            return 0
        return changed_segment_unsent(engine, segments[index].name, segments[index].text, earlier_text)

    def _explain(
        self,
        context: ExplainContext,
        recorded_status: int,
        engine: CacheReport,
        applied_rules: tuple[str, ...],
        conversation: ConversationLink | None,
    ) -> Explained:
        self.prepare(context)
        explanation = None
        if context.segments is not None:
            history = self.histories.for_tenant(context.tenant, context.settings.explain_history_size)
            # Without a cached count there is no reason to know: NULL, never a guess (the ledger's `unknown_tokens`).
            if engine.matched_tokens is not None and engine_locates(engine):
                explanation = explain_located(engine, context.segments, context.nearest, history, conversation)
            elif engine.matched_tokens is not None:
                explanation = classify(engine, compare(context.segments, context.nearest, history.text))
            if recorded_status < 400:
                history.add(context.segments, engine.prompt_tokens, context.request_id)
        settings = context.settings
        gain, job = None, None
        if context.route.adapter.supports_dry_run_match and self._random.random() < settings.uplift_sample_rate:
            if not applied_rules:
                gain = 0  # nothing was normalized: the raw request is the request
            elif engine.matched_tokens is not None:
                job = UpliftJob(
                    endpoint=context.endpoint,
                    raw_body=context.raw_body,
                    salt=context.salt,
                    match_url=context.route.match_url,
                    headers=context.route.headers,
                    normalized_matched_tokens=engine.matched_tokens,
                    template_tokens=engine.template_tokens or 0,
                )
        return Explained(explanation, self._chain(context, engine), gain, job)

    @staticmethod
    def _chain(context: ExplainContext, engine: CacheReport) -> RequestChain | None:
        if context.route.adapter.returns_hash_chain:
            return engine_chain(context.prefix_cache)  # present when the gateway (or the client) asked for it
        if not context.settings.hash_chain:
            return None
        text = canonical_prompt_text(context.endpoint, context.body)
        return approximate_chain(text, context.salt, context.settings.hash_block_size, engine.prompt_tokens)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Finish (bounded) the uplift checks in flight; their records are submitted either way."""
        await self.uplift.stop(timeout_s)


def _is_2xx(status: int | None) -> bool:
    return status is not None and 200 <= status < 300
