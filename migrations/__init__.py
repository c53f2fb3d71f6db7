"""Alembic migrations for prefixscope's database; run them with `db.migrate.upgrade` or `prefixscope db upgrade`."""
