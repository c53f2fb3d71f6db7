"""prefixscope's request database: models, engines, the batched writer and read-side queries.

Importing this package is cheap on purpose (no SQLAlchemy at package level), so that `prefixscope --help` and the
gateway's CLI do not pay for it. Import the submodules you need: `db.writer`, `db.queries`, `db.keys`, ...
"""
