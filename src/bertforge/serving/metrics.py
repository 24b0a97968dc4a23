"""The server's Prometheus metrics (prometheus_client), in a registry of its own per application."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


@dataclass
class ServerMetrics:
    registry: CollectorRegistry
    requests: Counter  # by route and status code
    latency: Histogram  # seconds from the request's arrival to its response, by route
    batch_texts: Histogram  # inputs per engine run, by model
    batch_seconds: Histogram  # seconds of an engine run on the worker thread, by model
    queue_seconds: Histogram  # seconds a request waited in its model's queue before its run began, by model
    queue_depth: Gauge  # requests queued or running, by model


def server_metrics() -> ServerMetrics:
    registry = CollectorRegistry()
    return ServerMetrics(
        registry,
        Counter("bertforge_requests", "HTTP requests answered, by route and status code", ["route", "status"],
                registry=registry),
        Histogram("bertforge_request_seconds", "Seconds from a request's arrival to its response", ["route"],
                  buckets=LATENCY_BUCKETS, registry=registry),
        Histogram("bertforge_batch_texts", "Inputs per model run (the requests a batch merged)", ["model"],
                  buckets=BATCH_BUCKETS, registry=registry),
        Histogram("bertforge_batch_seconds", "Seconds of one model run on the worker thread", ["model"],
                  buckets=LATENCY_BUCKETS, registry=registry),
        Histogram("bertforge_queue_seconds", "Seconds a request waited before the model run holding it began",
                  ["model"], buckets=LATENCY_BUCKETS, registry=registry),
        Gauge("bertforge_queue_depth", "Requests queued or running", ["model"], registry=registry),
    )
