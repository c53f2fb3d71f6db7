"""Span attributes of one gateway request: the OpenTelemetry GenAI semantic conventions, then `prefixscope.*`.

GenAI names come from `opentelemetry-semantic-conventions` (the `gen_ai_attributes` registry: `gen_ai.provider.name`
replaced `gen_ai.system`; cached prompt tokens are `gen_ai.usage.cache_read.input_tokens`, and `input_tokens`
includes them, as the conventions require). Prompt tokens written to a cache are `gen_ai.usage.cache_write.input_tokens`
in the current GenAI conventions, which the Python package has no constant for yet; the name it still has,
`gen_ai.usage.cache_creation.input_tokens` (deprecated by that rename, and what most backends read today), is sent
too.
Values: `gen_ai.operation.name` is `chat` (chat completions and Anthropic Messages) or `text_completion`;
`gen_ai.provider.name` is the upstream's kind where the registry has a value for it (`openai`, `anthropic`), else
the server's name (`vllm`, `sglang`, `prefixscope` for the local engine), as the conventions ask for providers they
do not list.

prefixscope's own attributes name what the record holds: the miss reason and recomputed tokens, where the prompt
diverged (segment, character offset, and who located it), the cached tokens per tier with the load-back time, the
replica with the routing policy, its predicted match and index, the normalization rules applied, the retention
class, the TTFT with its source. Prompt text appears only when the record holds it (the tenant's
`store_prompt_text`).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes, http_attributes

from db.ledger import LOST_CAUSES, lost_field
from db.records import RequestRecord, uncached_prompt_tokens

OPERATION_CHAT = gen_ai.GenAiOperationNameValues.CHAT.value
OPERATION_TEXT_COMPLETION = gen_ai.GenAiOperationNameValues.TEXT_COMPLETION.value
_OPERATIONS = {"chat.completions": OPERATION_CHAT, "messages": OPERATION_CHAT, "completions": OPERATION_TEXT_COMPLETION}
_PROVIDERS = {
    "openai": gen_ai.GenAiProviderNameValues.OPENAI.value,
    "anthropic": gen_ai.GenAiProviderNameValues.ANTHROPIC.value,
    "local_engine": "prefixscope",
    "vllm": "vllm",
    "sglang": "sglang",
}

# The GenAI names used here, in one place (the test checks spans against these and the registry).
OPERATION_NAME = gen_ai.GEN_AI_OPERATION_NAME
PROVIDER_NAME = gen_ai.GEN_AI_PROVIDER_NAME
REQUEST_MODEL = gen_ai.GEN_AI_REQUEST_MODEL
RESPONSE_MODEL = gen_ai.GEN_AI_RESPONSE_MODEL
RESPONSE_ID = gen_ai.GEN_AI_RESPONSE_ID
RESPONSE_FINISH_REASONS = gen_ai.GEN_AI_RESPONSE_FINISH_REASONS
INPUT_TOKENS = gen_ai.GEN_AI_USAGE_INPUT_TOKENS
OUTPUT_TOKENS = gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS
CACHE_READ_INPUT_TOKENS = gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS
CACHE_CREATION_INPUT_TOKENS = gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
CACHE_WRITE_INPUT_TOKENS = "gen_ai.usage.cache_write.input_tokens"  # the current name; no constant in the package yet
ERROR_TYPE = error_attributes.ERROR_TYPE
HTTP_STATUS_CODE = http_attributes.HTTP_RESPONSE_STATUS_CODE
PROMPT_TEXT = "prefixscope.prompt.text"


def operation_name(endpoint: str) -> str:
    return _OPERATIONS.get(endpoint, OPERATION_CHAT)


def provider_name(upstream_kind: str) -> str:
    return _PROVIDERS.get(upstream_kind, upstream_kind)


def record_attributes(record: RequestRecord, provider: str | None, response: Any) -> dict[str, Any]:
    """The span attributes for a finished request's record; `response` holds what only the response said (its id,
    model and finish reasons: `ResponseFacts`). Unknown values are left out, never sent as placeholders."""
    attributes: dict[str, Any] = {
        OPERATION_NAME: operation_name(record.endpoint),
        PROVIDER_NAME: provider,
        REQUEST_MODEL: record.model or None,
        RESPONSE_MODEL: response.response_model,
        RESPONSE_ID: response.response_id,
        RESPONSE_FINISH_REASONS: tuple(response.finish_reasons) or None,
        INPUT_TOKENS: record.prompt_tokens,
        OUTPUT_TOKENS: record.completion_tokens,
        CACHE_READ_INPUT_TOKENS: record.cached_tokens,
        CACHE_WRITE_INPUT_TOKENS: record.cache_write_tokens,
        CACHE_CREATION_INPUT_TOKENS: record.cache_write_tokens,
        HTTP_STATUS_CODE: record.status_code,
        ERROR_TYPE: record.error_type,
        "prefixscope.request_id": record.request_id,
        "prefixscope.tenant": record.tenant,
        "prefixscope.upstream": record.upstream or None,
        "prefixscope.stream": record.stream,
        "prefixscope.cache.miss_kind": record.miss_kind,
        "prefixscope.miss_reason": record.miss_reason,
        "prefixscope.recomputed_tokens": uncached_prompt_tokens(record),
        "prefixscope.divergence.segment": record.divergence_segment,
        "prefixscope.divergence.char_offset": record.divergence_char_offset,
        "prefixscope.divergence.source": record.divergence_source,
        "prefixscope.cache.tier.device_tokens": record.cached_tokens_device,
        "prefixscope.cache.tier.host_tokens": record.cached_tokens_host,
        "prefixscope.cache.tier.disk_tokens": record.cached_tokens_disk,
        "prefixscope.cache.load_ms": record.cache_load_ms,
        "prefixscope.replica": record.replica,
        "prefixscope.routing.policy": record.routing_policy,
        "prefixscope.routing.predicted_match_tokens": record.predicted_match_tokens,
        "prefixscope.routing.index_source": record.routing_index_source,
        "prefixscope.normalization.applied_rules": tuple(record.applied_rules) or None,
        "prefixscope.retention_class": record.retention_class,
        "prefixscope.ttft_ms": record.ttft_ms,
        "prefixscope.ttft_source": record.ttft_source,
        "prefixscope.conversation.id": record.conversation_id,
        "prefixscope.conversation.turn": record.turn_index,
        "prefixscope.conversation.parent_request_id": record.parent_request_id,
        "prefixscope.conversation.answer_rewrite": record.answer_rewrite,
        "prefixscope.ledger.new_tokens": record.new_tokens,
        "prefixscope.ledger.unknown_tokens": record.unknown_tokens,
        PROMPT_TEXT: record.prompt_text,
    }
    # The ledger's lost tokens by cause, the causes that cost something (`db.ledger.LOST_CAUSES`).
    for cause in LOST_CAUSES:
        if tokens := getattr(record, lost_field(cause)):
            attributes[f"prefixscope.ledger.lost.{cause}_tokens"] = tokens
    return {name: value for name, value in attributes.items() if value is not None}
