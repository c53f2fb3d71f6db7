"""Explaining every miss: why each answered request did not come further from cache, and what normalization gained.

- `segments`: a request as ordered segments (`model`, `tools`, `system`, `messages[i]`, or `prompt`), each hashed;
- `history`: per tenant, the segment hashes of recent requests, to find the nearest earlier request in O(segments);
- `compare`: how a request differs from that one (the first differing segment, the character offset in it, and
  whether it is a reorder, a volatile value or an unrelated prompt);
- `reasons`: the pure classification, engine report + divergence -> one of `db.records.MISS_REASONS` (the
  approximate method, for upstreams that do not say where their match ended);
- `located`: the explanation when the engine reports where its match ended (segment and character offset): the
  location is the engine's, the history only says why;
- `chains`: the prompt's block hash chain (the engine's, or an approximate one hashed from text);
- `uplift`: background dry-run matches of the un-normalized request (a sample, bounded, after the response);
- `explainer`: the glue the recorder calls when a request is sent and when it is answered.

Nothing here touches the database or delays the client: segments are looked up while the upstream works, the
classification runs after the response, and uplift checks run in background tasks.
"""
