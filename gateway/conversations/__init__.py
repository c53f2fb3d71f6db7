"""Conversations: which earlier request a request continues, and how the client re-sent the answer it was given.

- `link`: `ConversationLink`, what the recorder and the token ledger read about one request's conversation;
- `ids`: the conversation id a client gives (header, `prompt_cache_key`, `metadata`, `user`), in precedence order;
- `answer`: the answer the gateway returned, captured by the relays off the client's byte path;
- `rewrite`: how a re-sent answer differs from the one returned (`db.ledger.ANSWER_REWRITES`);
- `returned`: the tool calls the gateway returned, by name and arguments value, which the normalization rules write a
  re-sent call back as;
- `tracker`: `ConversationTracker`, linking requests by explicit id or by content, in bounded, expiring memory.
"""
