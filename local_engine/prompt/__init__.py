"""Text in and text out: chat message validation, chat templates to token ids, where each token came from,
incremental detokenization and tool-call formats."""
