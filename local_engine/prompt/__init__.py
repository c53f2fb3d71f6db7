"""Text in and text out: chat message validation, chat templates to token ids, where each token came from,
incremental detokenization, tool-call formats and the forced tool-name constraint."""
