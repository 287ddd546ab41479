"""An OpenAI-compatible client that records everything the user would have seen."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import requests

PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Request:
    """A deterministic request: temperature 0, EOS ignored, a fixed output length."""

    api: str
    stream: bool
    model: str
    prompt: str
    max_tokens: int

    @property
    def path(self) -> str:
        return PATHS[self.api]

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "seed": 0,
            "ignore_eos": True,
            "stream": self.stream,
        }
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body


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


@dataclass
class Response:
    """What the client saw, in order: status, frames, error, end of stream, or a transport error."""

    status: int | None = None
    headers_at: float | None = None
    chunks: list[Chunk] = field(default_factory=list)
    error: dict[str, Any] | None = None
    done: bool = False
    exception: str | None = None
    finished_at: float | None = None

    @property
    def content_chunks(self) -> int:
        return sum(1 for c in self.chunks if c.text)

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

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
        if self.exception:
            parts.append(f"transport error: {self.exception}")
        if self.done:
            parts.append("[DONE]")
        return ", ".join(parts)


def send(base_url: str, request: Request, response: Response, read_timeout_s: float) -> None:
    """Send `request` and record into `response` as data arrives; never raises."""
    try:
        with requests.post(
            base_url + request.path,
            json=request.body(),
            stream=request.stream,
            timeout=(CONNECT_TIMEOUT_S, read_timeout_s),
        ) as http:
            response.status = http.status_code
            response.headers_at = time.monotonic()
            if http.status_code != 200:
                response.error = _json_or_text(http.text)
            elif request.stream:
                _read_stream(http, response)
            else:
                response.chunks.append(Chunk(time.monotonic(), http.json()))
    except requests.RequestException as exc:
        response.exception = f"{type(exc).__name__}: {exc}"
    finally:
        response.finished_at = time.monotonic()


def _read_stream(http: requests.Response, response: Response) -> None:
    for line in http.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            response.done = True
            continue
        data = _json_or_text(payload)
        if "error" in data:
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
        self._thread = threading.Thread(
            target=send,
            args=(base_url, request, self.response, read_timeout_s),
            name=f"handoff-client-{request.api}",
            daemon=True,
        )
        self._thread.start()

    @property
    def finished(self) -> bool:
        return not self._thread.is_alive()
