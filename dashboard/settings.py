"""Dashboard settings: the one place the dashboard reads its environment.

`prefixscope dashboard` passes its options to the Streamlit process through these variables, so the pages never look
at `os.environ` themselves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_DATABASE_URL = "PREFIXSCOPE_DASHBOARD_DATABASE_URL"
ENV_ENGINE_URL = "PREFIXSCOPE_DASHBOARD_ENGINE_URL"
ENV_REFRESH_S = "PREFIXSCOPE_DASHBOARD_REFRESH_S"
ENV_PREFILL_TOKENS_PER_S = "PREFIXSCOPE_DASHBOARD_PREFILL_TOKENS_PER_S"
ENV_PRICE_FILE = "PREFIXSCOPE_DASHBOARD_PRICE_FILE"
ENV_ENGINE_TIMEOUT_S = "PREFIXSCOPE_DASHBOARD_ENGINE_TIMEOUT_S"
# The engine's admin token, which its cache views need (`prefixscope up` sets it).
ENV_ENGINE_TOKEN = "PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN"

DEFAULT_ENGINE_URL = "http://127.0.0.1:8001"
DEFAULT_REFRESH_S = 15.0
# Used for "prefill time saved" only when the engine cannot tell its measured speed. A rough figure for a small model
# on one GPU; the Overview page always says which figure it used.
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0
DEFAULT_ENGINE_TIMEOUT_S = 2.0


class SettingsError(ValueError):
    """An environment variable holds a value the dashboard cannot use."""


@dataclass(frozen=True)
class DashboardSettings:
    """Everything the dashboard pages need to know about their surroundings."""

    database_url: str
    engine_url: str = DEFAULT_ENGINE_URL
    refresh_s: float = DEFAULT_REFRESH_S
    default_prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    price_file: Path | None = None
    engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    engine_token: str | None = None


def _positive_float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a number") from exc
    if value <= 0:
        raise SettingsError(f"{name}={raw!r} must be positive")
    return value


def settings_from_env(environ: Mapping[str, str] | None = None) -> DashboardSettings:
    """Build settings from `environ` (default: the process environment).

    The database URL falls back to the `db` package's own resolution (its environment variable, then its default), so
    a dashboard started by hand with `streamlit run` finds the same database as the gateway.
    """
    env = os.environ if environ is None else environ
    from db.config import database_url_from_env

    explicit_url = env.get(ENV_DATABASE_URL, "").strip() or None
    price_file = env.get(ENV_PRICE_FILE, "").strip()
    return DashboardSettings(
        database_url=database_url_from_env(explicit_url),
        engine_url=(env.get(ENV_ENGINE_URL, "").strip() or DEFAULT_ENGINE_URL).rstrip("/"),
        refresh_s=_positive_float(env, ENV_REFRESH_S, DEFAULT_REFRESH_S),
        default_prefill_tokens_per_s=_positive_float(env, ENV_PREFILL_TOKENS_PER_S, DEFAULT_PREFILL_TOKENS_PER_S),
        price_file=Path(price_file) if price_file else None,
        engine_timeout_s=_positive_float(env, ENV_ENGINE_TIMEOUT_S, DEFAULT_ENGINE_TIMEOUT_S),
        engine_token=env.get(ENV_ENGINE_TOKEN, "").strip() or None,
    )


def settings_to_env(settings: DashboardSettings) -> dict[str, str]:
    """The environment variables that make `settings_from_env` return `settings` (used by the CLI)."""
    env = {
        ENV_DATABASE_URL: settings.database_url,
        ENV_ENGINE_URL: settings.engine_url,
        ENV_REFRESH_S: repr(settings.refresh_s),
        ENV_PREFILL_TOKENS_PER_S: repr(settings.default_prefill_tokens_per_s),
        ENV_ENGINE_TIMEOUT_S: repr(settings.engine_timeout_s),
    }
    if settings.price_file is not None:
        env[ENV_PRICE_FILE] = str(settings.price_file)
    if settings.engine_token is not None:
        env[ENV_ENGINE_TOKEN] = settings.engine_token
    return env
