"""An OpenAI-compatible client that records everything the user would have seen."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import requests
import sseclient

PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
CONNECT_TIMEOUT_S = 5.0
#: The header whose value Dynamo 1.6.1 takes as the request's id: the response's id
#: (`chatcmpl-<id>`) and each worker's `request received request_id=<id>` log line carry it.
REQUEST_ID_HEADER = "x-dynamo-request-id"
#: Structured output: Dynamo 1.6.1's frontend refuses to migrate a request whose guide it sees
#: (Dynamo issue 7634, fixed by 7930): a worker that took it over would restart the grammar at
#: its root while the tokens already sent come back as prompt. It sees every guide a request
#: can carry; one that a worker imposes by itself (`Guide.hidden`) it cannot see, and moves such
#: a request like any other: what the user gets then shows why it must not.


@dataclass(frozen=True)
class Guide:
    """A JSON schema or a regular expression the output must keep."""

    regex: str | None = None
    schema: Mapping[str, Any] | None = None
    #: Imposed by the worker, not sent with the request: the frontend cannot see it.
    hidden: bool = False

    def fields(self, api: str) -> dict[str, Any]:
        """The request body's fields that carry the guide."""
        if self.hidden:
            return {}
        if self.regex is not None:
            return {"guided_regex": self.regex}
        if api == "chat":
            schema = {"name": "handoff", "schema": self.schema}
            return {"response_format": {"type": "json_schema", "json_schema": schema}}
        return {"guided_json": self.schema}

    def broken(self, text: str) -> str | None:
        """Where `text` leaves the guide, in one line; None where it keeps it."""
        if self.regex is not None:
            if re.fullmatch(self.regex, text):
                return None
            openings = range(len(text) - 1, 0, -1)
            kept = next((i for i in openings if re.fullmatch(self.regex, text[:i])), 0)
            return (
                f"the output leaves its guide /{self.regex}/ at character {kept + 1}: "
                f"{text[kept : kept + 40]!r} (the longest opening it matches whole: {kept} "
                f"characters)"
            )
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            at = exc.pos
            return f"the output is not JSON at character {at + 1}: {text[at : at + 40]!r} ({exc})"
        return None


@dataclass(frozen=True)
class Stop:
    """A stop string the output must end at: the frontend stops the response once `text` has
    been generated, `ends` tokens in, and gives the user what came before it, the first
    `begins` tokens (the string excluded, OpenAI's rule). `spans`: its match must span the
    request's move; else the string lies wholly after it. `skipped`: a second stop string,
    earlier in the output from token `skipped_begins` on, that the request's `min_tokens` (the
    tokens the response must have before any stop string ends it) makes the response pass."""

    text: str
    begins: int
    ends: int
    spans: bool = True
    skipped: str | None = None
    skipped_begins: int = 0
    min_tokens: int | None = None


@dataclass(frozen=True)
class Sampling:
    """How the engine chooses each token: the best (`temperature` 0) or a draw seeded with
    `seed`, after penalties on the words already generated (`frequency_penalty` times each
    one's count, `presence_penalty` once) and on those of the prompt too (`repetition_penalty`,
    a divisor). The default is what every other request sends: the best word, no penalty."""

    temperature: float = 0.0
    seed: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def fields(self) -> dict[str, float]:
        """The body's fields: those that differ from the default, and temperature and seed."""
        sent = {k: v for k, v in asdict(self).items() if v != getattr(DEFAULT_SAMPLING, k)}
        return {"temperature": self.temperature, "seed": self.seed, **sent}


DEFAULT_SAMPLING = Sampling()


@dataclass(frozen=True)
class Annotations:
    """What an engine is told beside a request (`nvext.annotations`), for a request of
    `max_tokens` only: one made longer or shorter from it goes without (the mocker's replayed
    output is as long as the request it was planned for)."""

    values: tuple[str, ...]
    max_tokens: int


@dataclass(frozen=True)
class Request:
    """A request of a fixed output length, EOS ignored: deterministic (temperature 0) unless it
    asks for more than one choice."""

    api: str
    stream: bool
    model: str
    prompt: str
    max_tokens: int
    #: Sent as REQUEST_ID_HEADER where set: a worker's log then names the request before the
    #: client has read a byte of it.
    request_id: str | None = None
    guide: Guide | None = None
    #: `n`: how many completions of the prompt to generate. Above 1 the frontend requires a
    #: temperature above 0, so the output is drawn, not the model's one best.
    choices: int = 1
    #: How many of the most likely tokens' log-probabilities each generated token carries back
    #: (`Backend.top_logprobs`); 0 asks for none.
    top_logprobs: int = 0
    #: What the backend's engine is told beside the request (`nvext.annotations`).
    annotations: Annotations | None = None
    #: Sent with `ignore_eos` false, which Dynamo needs to keep a request's stop strings.
    stop: Stop | None = None
    sampling: Sampling = DEFAULT_SAMPLING

    @property
    def path(self) -> str:
        return PATHS[self.api]

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            **self.sampling.fields(),
            "ignore_eos": True,
            "stream": self.stream,
        }
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.guide is not None:
            body.update(self.guide.fields(self.api))
        if self.choices > 1:
            body.update(n=self.choices, temperature=1.0)
        if self.top_logprobs and self.api == "chat":
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        elif self.top_logprobs:
            body["logprobs"] = self.top_logprobs
        if self.annotated:
            body["nvext"] = {"annotations": list(self.annotations.values)}
        if self.stop is not None:
            strings = [s for s in (self.stop.skipped, self.stop.text) if s is not None]
            body.update(stop=strings, ignore_eos=False)
            if self.stop.min_tokens is not None:
                body["min_tokens"] = self.stop.min_tokens
        return body

    @property
    def ends(self) -> tuple[int, str]:
        """The completion tokens the response must count and its finish reason."""
        return (self.max_tokens, "length") if self.stop is None else (self.stop.ends, "stop")

    @property
    def annotated(self) -> bool:
        """Whether the request carries its annotations: only at the length they were made for."""
        return self.annotations is not None and self.annotations.max_tokens == self.max_tokens


@dataclass
class Chunk:
    """One SSE data frame (or the whole body of a unary response)."""

    at: float
    data: dict[str, Any]

    @property
    def choice(self) -> dict[str, Any]:
        choices = self.data.get("choices") or [{}]
        return choices[0]

    @property
    def text(self) -> str:
        choice = self.choice
        if "delta" in choice:
            return choice["delta"].get("content") or ""
        if "message" in choice:
            return choice["message"].get("content") or ""
        return choice.get("text") or ""

    @property
    def top_logprobs(self) -> list[dict[str, float]] | None:
        """The top log-probabilities of each token of this chunk, by token text, in the OpenAI
        shape of its API; None where the chunk carries none."""
        logprobs = self.choice.get("logprobs")
        if not isinstance(logprobs, dict):
            return None
        if "content" in logprobs:  # chat: a list of tokens, each with its top list
            return [
                {top["token"]: top["logprob"] for top in token.get("top_logprobs") or []}
                for token in logprobs["content"] or []
            ]
        return [dict(top or {}) for top in logprobs.get("top_logprobs") or []]


@dataclass
class Response:
    """What the client saw, in order: status, frames, error, end of stream, or a transport error.
    `streamed`: the request asked for SSE frames, which end with `[DONE]`. `protocol_errors`:
    what the frontend sent that an OpenAI client cannot read (a frame that is not JSON), kept
    as evidence rather than turned into an empty chunk."""

    status: int | None = None
    headers_at: float | None = None
    chunks: list[Chunk] = field(default_factory=list)
    error: dict[str, Any] | None = None
    done: bool = False
    exception: str | None = None
    finished_at: float | None = None
    protocol_errors: list[str] = field(default_factory=list)
    #: The client hung up (InFlight.close): the transport error that follows is its own.
    closed_by_client: bool = False
    streamed: bool = False

    @property
    def content_chunks(self) -> int:
        return sum(1 for c in self.chunks if c.text)

    @property
    def streamed_tokens(self) -> int:
        """The tokens the frames carried: as many as a frame's log-probabilities count where it
        has them (an engine may put several tokens in one frame), else one a content frame."""
        return sum(
            len(tops) if (tops := c.top_logprobs) is not None else 1 for c in self.chunks if c.text
        )

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def top_logprobs(self) -> list[dict[str, float]] | None:
        """The top log-probabilities of every generated token, in order; None where no chunk
        carries any."""
        found = [c.top_logprobs for c in self.chunks]
        if all(tops is None for tops in found):
            return None
        return [token for tops in found for token in tops or []]

    @property
    def finish_reason(self) -> str | None:
        reasons = [c.choice.get("finish_reason") for c in self.chunks]
        return next((r for r in reversed(reasons) if r), None)

    @property
    def usage(self) -> dict[str, Any] | None:
        return next((c.data["usage"] for c in reversed(self.chunks) if c.data.get("usage")), None)

    @property
    def completion_tokens(self) -> int | None:
        return (self.usage or {}).get("completion_tokens")

    def summary(self) -> str:
        """One line: how the response ended, for verdicts and timeouts."""
        parts = [f"HTTP {self.status}", f"{self.content_chunks} content chunk(s)"]
        if self.finish_reason:
            parts.append(f"finish_reason={self.finish_reason}")
        if self.completion_tokens is not None:
            parts.append(f"completion_tokens={self.completion_tokens}")
        if self.error is not None:
            parts.append(f"error={json.dumps(self.error)[:200]}")
        if self.closed_by_client:
            parts.append("closed by the client")
        elif self.exception:
            parts.append(f"transport error: {self.exception}")
        parts += self.protocol_errors
        if self.done:
            parts.append("[DONE]")
        return ", ".join(parts)


def send(
    base_url: str,
    request: Request,
    response: Response,
    read_timeout_s: float,
    opened: Callable[[requests.Response], None] | None = None,
) -> None:
    """Send `request` and record into `response` as data arrives; never raises. `opened` is
    given the HTTP response once its headers are in."""
    response.streamed = request.stream
    try:
        with requests.post(
            base_url + request.path,
            json=request.body(),
            headers={REQUEST_ID_HEADER: request.request_id} if request.request_id else None,
            stream=request.stream,
            timeout=(CONNECT_TIMEOUT_S, read_timeout_s),
        ) as http:
            if opened is not None:
                opened(http)
            response.status = http.status_code
            response.headers_at = time.monotonic()
            if http.status_code != 200:
                response.error = _json_or_text(http.text)
            elif request.stream:
                # Chunk by chunk as they arrive: each frame is timed when it came.
                _read_stream(http.iter_content(chunk_size=None), response)
            else:
                _record_frame(http.text, response, "the response body")
    except (requests.RequestException, OSError) as exc:
        response.exception = f"{type(exc).__name__}: {exc}"
    finally:
        response.finished_at = time.monotonic()


def _read_stream(body: Iterable[bytes], response: Response) -> None:
    """Record each server-sent event of `body` (parsed as the SSE spec says: a `data` field
    over several lines is one payload, lines joined by newlines) until the stream ends."""
    for event in sseclient.SSEClient(body).events():
        if event.data == "[DONE]":
            response.done = True
        else:
            _record_frame(event.data, response, "an SSE frame")


def _record_frame(payload: str, response: Response, what: str) -> None:
    """One JSON object from the frontend: a chunk, or the error it carries."""
    try:
        data = json.loads(payload)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        response.protocol_errors.append(f"{what} is not a JSON object: {payload[:200]!r}")
    elif "error" in data:
        response.error = data["error"] if isinstance(data["error"], dict) else data
    else:
        response.chunks.append(Chunk(time.monotonic(), data))


def _json_or_text(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"message": text}
    return value if isinstance(value, dict) else {"message": value}


class InFlight:
    """A request running in a background thread, observable while it runs."""

    def __init__(self, base_url: str, request: Request, read_timeout_s: float) -> None:
        self.request = request
        self.response = Response()
        self.sent_at = time.monotonic()
        self._http: requests.Response | None = None
        self._thread = threading.Thread(
            target=send,
            args=(base_url, request, self.response, read_timeout_s, self._opened),
            name=f"handoff-client-{request.api}",
            daemon=True,
        )
        self._thread.start()

    def _opened(self, http: requests.Response) -> None:
        self._http = http

    @property
    def finished(self) -> bool:
        return not self._thread.is_alive()

    def close(self) -> float:
        """Hang up, as a user who closes the page: the connection is shut down under the
        reading thread, and the frontend sees its client gone. When, by the monotonic clock."""
        if self._http is None:
            raise RuntimeError("the response has not begun: there is no connection to close")
        self.response.closed_by_client = True
        self._http.raw.connection.sock.shutdown(socket.SHUT_RDWR)
        return time.monotonic()


def completion_problems(response: Response, tokens: int, finish: str = "length") -> list[str]:
    """A whole response: HTTP 200, no error frame, its `finish` reason, `tokens` counted in its
    usage, and a stream's closing frame."""
    if response.exception:
        return [f"the response did not complete: {response.exception}"]
    if response.status != 200:
        return [f"expected a complete response, got HTTP {response.status}: {response.error}"]
    problems = []
    if response.error is not None:
        problems.append(f"the stream carried an error frame: {response.error}")
    if response.finish_reason != finish:
        problems.append(f"finish_reason {response.finish_reason!r}, expected {finish!r}")
    if response.completion_tokens != tokens:
        problems.append(
            f"{response.completion_tokens} completion tokens in usage, expected {tokens}"
        )
    if response.streamed and not response.done:
        problems.append("the stream ended without its closing data: [DONE] frame")
    return problems
