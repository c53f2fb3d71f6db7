"""The Anthropic Messages API on the gateway (`POST /v1/messages`, `POST /v1/messages/count_tokens`).

`request` parses and validates a Messages body and finds its `cache_control` breakpoints; `normalize` applies the
semantics-preserving rules in Anthropic's own shape; `translate` turns a request into an OpenAI chat body and a chat
response into a Message; `accounting` splits prompt tokens into cache reads, cache writes and the rest as Anthropic
reports them; `stream` writes Anthropic's server-sent events; `engine_forward` and `passthrough` call the upstreams;
`handler` is the HTTP edge.
"""

MESSAGES = "messages"
