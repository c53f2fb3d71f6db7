"""Fleet-wide prompt patterns: keyed block signatures of sampled prompts (`signature`), stored per request
(`store`), and the patterns found across tenants and conversations (`finder`)."""
