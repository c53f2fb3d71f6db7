"""The OpenAI Responses API on the gateway (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`).

`request` parses and validates a Responses body; `translate` turns it into an OpenAI chat body (with the stored
conversation of `previous_response_id`) and a chat completion back into a Response; `stream` writes the Responses
event sequence from chat chunks; `store` keeps what a later `previous_response_id` or `GET` needs, per tenant,
bounded and expiring; `engine_forward` calls upstreams that speak the chat API (the local engine, vLLM, SGLang);
`passthrough` sends the normalized body on to an OpenAI upstream unchanged; `handler` is the HTTP edge.
"""

from gateway.parsing import RESPONSES

__all__ = ["RESPONSES"]
