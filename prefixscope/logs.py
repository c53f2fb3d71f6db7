"""Library loggers that would otherwise flood a program's INFO log.

httpx logs every request it sends at INFO (the gateway sends one per proxied request), and Alembic logs one
"setup plugin" line per plugin each time a migration context starts. Programs that configure INFO logging call
`quiet_library_loggers` once; with `debug=True` the libraries keep logging everything.
"""

from __future__ import annotations

import logging

NOISY_LOGGERS = ("httpx", "httpcore", "alembic.runtime.plugins")


def quiet_library_loggers(debug: bool = False) -> None:
    """Raise the noisy library loggers to WARNING (or leave them at DEBUG when `debug`)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.WARNING)
