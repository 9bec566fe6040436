"""The ingest counters of `GET /metrics` (Prometheus), kept with prometheus_client.

One server process counts in memory. The worker processes of `vantage serve --workers N` share
one port, so a scrape reaches any one of them: they count in prometheus_client's multiprocess
mode (``PROMETHEUS_MULTIPROC_DIR``, which `vantage serve` sets to a folder of its own before it
starts them), and every scrape answers the sum over the process group. Before, each worker
answered its own counts, so consecutive scrapes went up and down and Prometheus read resets.

One process also answers each counter's standard ``_created`` sample (the multiprocess mode has
none). They stay on: turning them off is process-wide in prometheus_client, and would change the
exposition of an application that embeds the server and counts with it too."""

from __future__ import annotations

import os

from prometheus_client import (
    CollectorRegistry,
    Counter,
    generate_latest,
    multiprocess,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_REGISTRY = CollectorRegistry()
INGESTED_GROUPS = Counter("vantage_ingested_groups", "Groups stored by ingest.", registry=_REGISTRY)
DUPLICATE_GROUPS = Counter(
    "vantage_duplicate_groups", "Groups sent again with the same content.", registry=_REGISTRY
)
CONFLICT_GROUPS = Counter(
    "vantage_conflict_groups",
    "Groups sent again with other content (not stored).",
    registry=_REGISTRY,
)
INGEST_REQUESTS = Counter(
    "vantage_ingest_requests", "Step batches stored (requests answered 200).", registry=_REGISTRY
)


def count_ingest(accepted: int, duplicates: int, conflicts: int) -> None:
    """Count one stored batch and its groups."""
    INGESTED_GROUPS.inc(accepted)
    DUPLICATE_GROUPS.inc(duplicates)
    CONFLICT_GROUPS.inc(conflicts)
    INGEST_REQUESTS.inc()


def counters_text() -> str:
    """The counters in Prometheus' text format: this process's, or with
    ``PROMETHEUS_MULTIPROC_DIR`` set, the sum over every process that counted there."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry).decode()
    return generate_latest(_REGISTRY).decode()
