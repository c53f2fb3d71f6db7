"""The `[telemetry]` section of the gateway's config: where request spans go (off unless an endpoint is given).

    [telemetry]
    otlp_endpoint = "http://127.0.0.1:4318"    # OTLP/HTTP base URL (/v1/traces is added) or the full traces URL
    service_name = "prefixscope-gateway"       # the spans' service.name
    headers = { "x-api-key" = "..." }          # sent with each export (a hosted backend's key)
    export_timeout_s = 5                       # one export, with its retries, on the export thread

The standard OpenTelemetry environment variables (`prefixscope.tracing.export_from_env`) win over the file, as
`$PREFIXSCOPE_DATABASE_URL` wins over `database_url`; `OTEL_SDK_DISABLED=true` turns tracing off whatever the file
says. The CLI applies them (`with_environment`); nothing here reads the environment itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.errors import ConfigError

DEFAULT_SERVICE_NAME = "prefixscope-gateway"


@dataclass(frozen=True)
class TelemetrySettings:
    otlp_endpoint: str | None = None
    service_name: str = DEFAULT_SERVICE_NAME
    headers: Mapping[str, str] = field(default_factory=dict)
    export_timeout_s: float = 5.0

    def trace_export(self) -> Any:
        """The `prefixscope.tracing.TraceExport` these settings ask for, or None when tracing is off."""
        if not self.otlp_endpoint:
            return None
        from prefixscope.tracing import TraceExport, traces_url

        return TraceExport(
            traces_url=traces_url(self.otlp_endpoint),
            service_name=self.service_name,
            headers=dict(self.headers),
            export_timeout_s=self.export_timeout_s,
        )


def parse_telemetry_settings(values: dict[str, Any]) -> TelemetrySettings:
    """Build the settings from the `[telemetry]` table. Raises `ConfigError` naming a bad or unknown key."""
    base = TelemetrySettings()
    endpoint = values.pop("otlp_endpoint", None)
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))):
        raise ConfigError(f"[telemetry] otlp_endpoint must be an http:// or https:// URL, not {endpoint!r}")
    headers = values.pop("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ConfigError("[telemetry] headers must be a table of strings")
    try:
        timeout_s = float(values.pop("export_timeout_s", base.export_timeout_s))
    except (TypeError, ValueError):
        raise ConfigError("[telemetry] export_timeout_s must be a number of seconds") from None
    if timeout_s <= 0:
        raise ConfigError("[telemetry] export_timeout_s must be positive")
    service_name = str(values.pop("service_name", base.service_name))
    if values:
        raise ConfigError(f"unknown [telemetry] keys: {sorted(values)}")
    return TelemetrySettings(
        otlp_endpoint=endpoint or None,
        service_name=service_name,
        headers={str(k).lower(): v for k, v in headers.items()},
        export_timeout_s=timeout_s,
    )


def with_environment(settings: TelemetrySettings, env: Mapping[str, str]) -> TelemetrySettings:
    """`settings` with the standard OpenTelemetry environment variables applied (they win over the file).
    Raises `ConfigError` on malformed `OTEL_EXPORTER_OTLP_HEADERS` or timeout, or an unsupported protocol."""
    from prefixscope.tracing import ENV_SERVICE_NAME, export_from_env, tracing_disabled

    if tracing_disabled(env):
        return replace(settings, otlp_endpoint=None)
    try:
        export = export_from_env(env, settings.service_name, settings.export_timeout_s)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if export is None:
        service_name = env.get(ENV_SERVICE_NAME, "").strip() or settings.service_name
        return replace(settings, service_name=service_name)
    return replace(
        settings,
        otlp_endpoint=export.traces_url,
        service_name=export.service_name,
        headers={**settings.headers, **export.headers},
        export_timeout_s=export.export_timeout_s,
    )
