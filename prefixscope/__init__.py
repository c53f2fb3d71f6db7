"""The `prefixscope` console command: one entry point over the engine, gateway, database and dashboard."""
