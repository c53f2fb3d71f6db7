"""`prefixscope bench explain`: are the recorded explanations and token ledgers right?

Agent conversations (an order-support agent's shared tools and system prompt, a history growing with the answers
the gateway returned, tool calls and results, a timestamp, several tenants, a replica pair, think times around the
engines' idle TTL) are sent through a real gateway to real engines (`deployment`), each with one injected change of
a known kind (`kinds`: 22 of them, from a clean next turn to an answer re-sent with its whitespace changed, an
eviction or an expiry). The recorded rows are read back from the database and graded against each kind's ground
truth (`grading`): the miss reason, the location (within one token), the ledger part that carries the lost tokens,
and the share of rows whose ledger adds up exactly.

Modules: `material` (the text), `conversation` (a client's view of a conversation), `layout` (locations in the
engine's terms), `kinds` (the injections and their truth), `grading` (the table), `deployment` (the programs),
`run` (the command).
"""
