"""The engine proper: the worker loop, the scheduler, per-request sequences and their KV slot tables, sampling,
counters and graceful shutdown."""
