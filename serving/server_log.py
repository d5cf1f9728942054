"""What llama-cpp-python's server log says about each completion's prompt.

The server (verbose, its default) writes, for every completion it runs:

    Llama._create_completion: cache hit          (a saved state was restored; --cache only)
    Llama.generate: 3290 prefix-match hit, remaining 36 prompt tokens to eval
    llama_perf_context_print: prompt eval time =  935.16 ms /    36 tokens (...)
    llama_perf_context_print:        eval time =  286.31 ms /    12 runs   (...)
    llama_perf_context_print:       total time = 1304.73 ms /    48 tokens

and uvicorn an access line when an HTTP request ends. The response's usage
has no cached-token count, so this log is the only place that says how much
of a prompt was read again and how much came from the KV state: the latency
benchmark and the prompt-reuse test read it here. One chat request may run
several completions (``chatml-function-calling`` first lets the model choose
between a message and a tool, then generates it).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

_PREFIX = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")
_FULL = "Llama.generate: full prompt already cached"
_RESTORED = "Llama._create_completion: cache hit"
_PERF = re.compile(r"llama_perf_context_print:\s+(prompt eval|eval|total) time =\s+([\d.]+) ms"
                   r" /\s+(\d+) (?:tokens|runs)")
_REQUEST_END = re.compile(r'"POST /v1/(?:chat/)?completions HTTP/1\.\d" \d+')


@dataclass
class Completion:
    """One ``Llama.create_completion`` as the log reports it; times in ms."""

    reused: int = 0  # prompt tokens kept in the KV state (0: the whole prompt was read)
    evaluated: int = 0  # prompt tokens read this time
    restored: bool = False  # a saved state was loaded from the prompt cache first
    exact: bool = False  # the very same prompt was already evaluated (counts unknown)
    prompt_eval_ms: float = 0.0
    eval_ms: float = 0.0  # generating the tokens after the prompt
    runs: int = 0  # generated tokens (decode steps)
    total_ms: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return self.reused + self.evaluated

    @property
    def first_token_ms(self) -> float:
        """From the completion's start to its first generated token: the whole prompt
        (restore included), plus one decode step."""
        per_token = self.eval_ms / self.runs if self.runs else 0.0
        return self.total_ms - self.eval_ms + per_token


@dataclass
class Request:
    """The completions one HTTP request ran, in order."""

    completions: list[Completion] = field(default_factory=list)

    @property
    def prompt(self) -> Completion:
        """The completion that read the request's prompt (the later ones extend it)."""
        return self.completions[0]


def parse_requests(text: str) -> list[Request]:
    """The finished HTTP requests in a slice of the log (a request with no completion,
    e.g. ``GET /v1/models``, has no access line matched and is not counted)."""
    requests, current, pending = [], Request(), Completion()
    for line in text.splitlines():
        if match := _PREFIX.search(line):
            pending.reused, pending.evaluated = int(match[1]), int(match[2])
        elif _FULL in line:
            pending.exact = True
        elif _RESTORED in line:
            pending.restored = True
        elif match := _PERF.search(line):
            kind, ms, count = match[1], float(match[2]), int(match[3])
            if kind == "prompt eval":
                pending.prompt_eval_ms = ms
                if not (pending.evaluated or pending.reused or pending.exact):
                    pending.evaluated = count  # no prefix line: the whole prompt was read
            elif kind == "eval":
                pending.eval_ms, pending.runs = ms, count
            else:
                pending.total_ms = ms
                current.completions.append(pending)
                pending = Completion()
        elif _REQUEST_END.search(line) and current.completions:
            requests.append(current)
            current = Request()
    return requests


class LogTail:
    """The requests a server logged since the last read.

    uvicorn writes a request's access line just after the response, so a reader
    that just got its answer polls briefly for the number of requests it sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size

    async def requests(self, expected: int = 1, wait_s: float = 5.0) -> list[Request]:
        deadline = time.monotonic() + wait_s
        while True:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
            found = parse_requests(data.decode("utf-8", "replace"))
            if len(found) >= expected or time.monotonic() > deadline:
                self.offset += len(data)
                return found
            await asyncio.sleep(0.05)
