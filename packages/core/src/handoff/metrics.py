"""Reading Prometheus text from the frontend and workers with prometheus_client's parser."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families

MIGRATION_TOTAL = "dynamo_frontend_model_migration_total"
MIGRATION_DURATION_COUNT = "dynamo_frontend_model_migration_duration_seconds_count"
MAX_SEQ_LEN_EXCEEDED = "dynamo_frontend_model_migration_max_seq_len_exceeded_total"
OUTPUT_TOKENS = "dynamo_frontend_output_tokens_total"
TTFT = "dynamo_frontend_time_to_first_token_seconds"


def scrape(url: str, timeout_s: float = 5.0) -> str:
    response = requests.get(url, timeout=timeout_s)
    response.raise_for_status()
    return response.text


def sample_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of the samples called `name` whose labels include `labels`.

    An absent series counts as 0: Dynamo exports no migration series before the first migration.
    Only the lines that can hold `name` are parsed: a frontend's page runs to hundreds of series.
    """
    labels = labels or {}
    family = name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    relevant = "\n".join(line for line in text.splitlines() if family in line)
    return sum(
        sample.value
        for parsed in text_string_to_metric_families(relevant + "\n")
        for sample in parsed.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def worker_sum(system_port: int, name: str, labels: Mapping[str, str] | None = None) -> float:
    """`sample_sum` of a worker's own /metrics; 0 when the worker does not answer."""
    try:
        text = scrape(f"http://127.0.0.1:{system_port}/metrics", timeout_s=2)
    except requests.RequestException:
        return 0.0
    return sample_sum(text, name, labels)


def frontend_output_tokens(url: str, model: str) -> int:
    """Tokens the frontend has received from workers: how far a unary request has got."""
    return int(sample_sum(scrape(url), OUTPUT_TOKENS, {"model": model}))


def frontend_mean_ttft(url: str, model: str) -> float | None:
    """Mean time to first token the frontend has observed, None before any first token."""
    text = scrape(url)
    count = sample_sum(text, TTFT + "_count", {"model": model})
    return sample_sum(text, TTFT + "_sum", {"model": model}) / count if count else None


@dataclass(frozen=True)
class MigrationCounts:
    """The frontend's migration counters for one model."""

    ongoing_request: int
    new_request: int
    max_seq_len_exceeded: int
    succeeded: int
    failed: int

    @classmethod
    def parse(cls, text: str, model: str) -> MigrationCounts:
        def count(name: str, **labels: str) -> int:
            return int(sample_sum(text, name, {"model": model, **labels}))

        return cls(
            ongoing_request=count(MIGRATION_TOTAL, migration_type="ongoing_request"),
            new_request=count(MIGRATION_TOTAL, migration_type="new_request"),
            max_seq_len_exceeded=count(MAX_SEQ_LEN_EXCEEDED),
            succeeded=count(MIGRATION_DURATION_COUNT, outcome="success"),
            failed=count(MIGRATION_DURATION_COUNT, outcome="failure"),
        )

    def since(self, before: MigrationCounts) -> MigrationCounts:
        """What the counters rose by after `before` was read."""
        now, then = self.as_dict(), before.as_dict()
        return MigrationCounts(**{k: now[k] - then[k] for k in now})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
