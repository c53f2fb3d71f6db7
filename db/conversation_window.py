"""The range of conversations listed when none is asked for and the most one list may hold, shared by
`prefixscope conversations` and `GET /api/conversations` so that both list the same conversations. Cheap to import
(no SQLAlchemy)."""

from __future__ import annotations

from typing import Final

CONVERSATIONS_DEFAULT_SINCE: Final = "7d"
"""How far back the conversation list reaches by default: a duration before now (`db.timeutil.parse_duration`)."""

CONVERSATIONS_MAX_LIMIT: Final = 1000
"""The most conversations one list holds: a larger `limit` is refused (`db.query_params.row_limit`)."""
