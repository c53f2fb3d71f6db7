"""Request normalization: named, pure, idempotent rules that make equivalent prompts byte-identical.

`pipeline.build_pipeline(settings)` assembles a tenant's rules; `rules` holds the semantics-preserving ones and
`volatile` the opt-in hoisting of dates and ids out of the system prompt.
"""
