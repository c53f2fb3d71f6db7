"""What the gateway tells an operator's observability stack: per-tenant hit counters and OpenTelemetry request spans
following the GenAI semantic conventions (see docs/telemetry.md)."""
