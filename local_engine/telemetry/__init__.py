"""What the engine tells an operator's observability stack: vLLM-named Prometheus series and OpenTelemetry spans."""
