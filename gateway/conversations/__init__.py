"""Conversations: which earlier request a request continues, and how the client re-sent the answer it was given.

- `link`: `ConversationLink`, what the recorder and the token ledger read about one request's conversation.
"""
