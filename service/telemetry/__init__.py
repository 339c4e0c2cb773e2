"""Logs, metrics and traces: what an operator sees of a running service.

- :mod:`.context`: the request or task a log line belongs to (request id, tenant, start time);
- :mod:`.logs`: JSON log lines carrying that context (python-json-logger over stdlib logging);
- :mod:`.metrics`: the Prometheus metrics every layer records into (prometheus-client, in
  multi-process mode when ``PROMETHEUS_MULTIPROC_DIR`` is set);
- :mod:`.tracing`: optional OpenTelemetry traces (the ``tracing`` extra).

It sits at the bottom of the layering (next to ``service.config``): every layer may record a
metric or log with context, and nothing here imports a layer above.
"""
