"""Reading Prometheus text from the frontend and workers with prometheus_client's parser."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TypeVar

import requests
from prometheus_client.parser import text_string_to_metric_families

from handoff.errors import CaseFailure
from handoff.machine.polling import Deadline, poll_until

T = TypeVar("T")

MIGRATION_TOTAL = "dynamo_frontend_model_migration_total"
MIGRATION_DURATION_COUNT = "dynamo_frontend_model_migration_duration_seconds_count"
MAX_SEQ_LEN_EXCEEDED = "dynamo_frontend_model_migration_max_seq_len_exceeded_total"
OUTPUT_TOKENS = "dynamo_frontend_output_tokens_total"
#: The prompt tokens the frontend tokenized, summed over requests: once a request, migrated or not.
INPUT_TOKENS = "dynamo_frontend_input_sequence_tokens_sum"
TTFT = "dynamo_frontend_time_to_first_token_seconds"
#: The requests a worker has received, on its own system port.
REQUESTS = "dynamo_component_requests_total"
#: How long one read of a worker's /metrics may take: a busy vLLM CPU worker answered in up to
#: 3.6 s (docs/known-issues.md), so a shorter bound would leave it unknown on every poll.
WORKER_READ_S = 5.0


def scrape(url: str, timeout_s: float = 5.0) -> str:
    response = requests.get(url, timeout=timeout_s)
    response.raise_for_status()
    return response.text


def sample_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of the samples called `name` whose labels include `labels`.

    An absent series counts as 0: Dynamo exports no migration series before the first migration.
    Only the lines that can hold `name` are parsed: a frontend's page runs to hundreds of series.
    """
    return sum(samples(text, name, labels))


def samples(text: str, name: str, labels: Mapping[str, str] | None = None) -> list[float]:
    """The values of the samples called `name` whose labels include `labels`; none where the
    page has no such series."""
    labels = labels or {}
    family = name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    relevant = "\n".join(line for line in text.splitlines() if family in line)
    return [
        sample.value
        for parsed in text_string_to_metric_families(relevant + "\n")
        for sample in parsed.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


class Unanswered(CaseFailure):
    """Workers whose /metrics could not be read: what they would have said is unknown, never 0
    or idle. Uncaught, it fails the case by their names."""


def worker_sums(
    ports: Mapping[str, int],
    name: str,
    labels: Mapping[str, str] | None = None,
    timeout_s: float = WORKER_READ_S,
    required: bool = False,
) -> dict[str, float]:
    """`sample_sum` of each worker's own /metrics, by worker name (`ports`: name -> system
    port). Raises Unanswered, naming every worker that did not answer and what the others said.
    `required`: a worker whose page has no such series did not answer either (a gauge that is
    absent says nothing, where an absent counter means 0)."""
    read, silent = {}, []
    for worker, port in ports.items():
        try:
            text = scrape(f"http://127.0.0.1:{port}/metrics", timeout_s=timeout_s)
        except requests.RequestException as exc:
            silent.append(f"{worker} (port {port}: {type(exc).__name__})")
            continue
        found = samples(text, name, labels)
        if required and not found:
            silent.append(f"{worker} (port {port}: exports no {name})")
        else:
            read[worker] = sum(found)
    if silent:
        said = "".join(f"; {worker} said {value:g}" for worker, value in read.items())
        raise Unanswered(f"no answer to {name} from {', '.join(silent)}{said}")
    return read


def once_answered(read: Callable[[], T], deadline: Deadline, awaited: str) -> T:
    """`read()` polled until it raises no Unanswered: a reading that lacks a worker is asked
    again, and the timeout names the workers that never answered."""

    def probe() -> tuple[T | None, object]:
        try:
            return read(), None
        except Unanswered as exc:
            return None, exc

    return poll_until(probe, deadline, awaited)


def frontend_output_tokens(url: str, model: str) -> int:
    """Tokens the frontend has received from workers: how far a unary request has got."""
    return int(sample_sum(scrape(url), OUTPUT_TOKENS, {"model": model}))


def frontend_ttft(url: str, model: str) -> tuple[float, float]:
    """The frontend's time to first token for `model`: the seconds summed over the first
    tokens it has recorded, and how many. Two readings' difference is the requests' between."""
    text = scrape(url)
    labels = {"model": model}
    return sample_sum(text, TTFT + "_sum", labels), sample_sum(text, TTFT + "_count", labels)


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

    @classmethod
    def read(cls, url: str, model: str) -> MigrationCounts:
        """The counters as the frontend's /metrics at `url` gives them now."""
        return cls.parse(scrape(url), model)

    @property
    def moves(self) -> int:
        """The migrations counted, of a request in flight and of one not yet started."""
        return self.ongoing_request + self.new_request

    def since(self, before: MigrationCounts) -> MigrationCounts:
        """What the counters rose by after `before` was read."""
        now, then = self.as_dict(), before.as_dict()
        return MigrationCounts(**{k: now[k] - then[k] for k in now})

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class FrontendReading:
    """What a case reads of the frontend before its request and after it, from one scrape: the
    migration counters, the tokens received from workers (how far a unary request has got) and
    the prompt tokens counted (the prompt as the frontend tokenized it)."""

    counts: MigrationCounts
    output_tokens: int
    prompt_tokens: float

    @classmethod
    def read(cls, url: str, model: str) -> FrontendReading:
        text = scrape(url)
        return cls(
            MigrationCounts.parse(text, model),
            int(sample_sum(text, OUTPUT_TOKENS, {"model": model})),
            sample_sum(text, INPUT_TOKENS),
        )
