"""The prefixscope gateway: an OpenAI-compatible reverse proxy in front of prompt-caching engines.

Request path (`proxy`): authenticate the key in memory (`auth`) -> read the body within the size limit
(`asgi_io`) -> parse and validate (`parsing`) -> normalize (`normalize/`) -> replace any client salt with the
tenant's derived one (`tenancy`, `upstreams/`) -> pick the retention class, the ask lowered to the tenant's maximum
(`retention`) -> route by model (`routing`) -> forward or stream through the
shared HTTP client (`http_client`, `transport`, `forwarding`, `sse`) -> hand one record to the background
writer (`recording`). Nothing on that path waits on the database.

Every answered request is explained (`explain/`): why it did not come further from cache (one reason, the segment
and character offset where it first differed from the nearest earlier request, the tokens that cost), the prompt's
block hash chain for the what-if simulator, and for a sample a normalization uplift measured by a background dry-run
match. The lookup runs while the upstream works, the rest after the response.

Around it: the Litestar app and its lifespan (`app`), `/v1/models` (`models_api`), `/api/stats` (`stats_api`),
Prometheus counters (`metrics`), the database door (`storage`), configuration (`config`, `tenant_settings`), errors
(`errors`, `edge_errors`), the uvicorn server (`server`), the CLI (`cli`) and the benchmark (`bench/`).
"""
