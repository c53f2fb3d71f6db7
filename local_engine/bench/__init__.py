"""`prefixscope bench engine` and `prefixscope bench tiers`: figures and a verdict against targets."""
