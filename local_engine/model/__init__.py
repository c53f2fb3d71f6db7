"""The served model: loading it from local files, the forward pass, and attention read from the KV pool (torch paged,
cascade, FlashInfer)."""
