"""Demo request history made by the gateway's own request path (`prefixscope demo-data`).

- `traffic`: the demo tenants and the request bodies their clients send;
- `engine_model`: a paged prefix cache of a given capacity, answering in an engine's response shapes;
- `replay`: each request through normalization, salting, the record builder and the explainer;
- `history`: the seeded history over several days, written with the database's bulk store;
- `cli`: the `demo-data` command.
"""
