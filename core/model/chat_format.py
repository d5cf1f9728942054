"""The chat format that serves a model when ``model.chat_format = "auto"``: from the
GGUF's own chat template.

The chat format decides three things that must agree: how llama-cpp-python's
server renders the prompt and parses tool calls (``--chat_format``), how the
client shapes its messages (``core.model.wire``), and how the night renders
the same turns into tokens (``trainer.tokens``). So it is resolved here, once
per GGUF, by one deterministic rule that the bot and the trainer both apply to
the configured model (``config.served_gguf``; a night's release is a
conversion of the same model, with the same template).

The rule, from the template in the GGUF's ``tokenizer.chat_template``:

- llama-cpp-python's server parses tool calls in exactly one generic format,
  ``chatml-function-calling``. Its other formats are either plain chat (no
  tools) or tied to particular fine-tunes (functionary), and with no format it
  renders the GGUF's Jinja template but parses no tool calls from the answer.
- So a ChatML template (``<|im_start|>``: SmolLM2, Qwen2/2.5/3, many others),
  or no template at all, gets ``chatml-function-calling``: the model's own turn
  tokens, with the server's tool-call syntax.
- Any other template (Llama 3, Gemma, Mistral, Phi-3, ...) also gets
  ``chatml-function-calling``, the only format with tool calls that the
  trainer can render, and the reason says plainly that ``<|im_start|>`` is not
  that model's own token: tool calls will be weaker. The way out is named:
  ``server.kind = "llama-server"`` (its ``--jinja`` uses the model's own
  template and tool syntax), or a plain format such as ``llama-3`` for chat
  without tools.

The template is read from the GGUF's header only (``read_chat_template``): the
key-value section is walked and skipped without loading tensors or building
the 50,000-entry token list (``gguf.GGUFReader`` took seconds for that). It is
still file IO, so callers on an event loop use ``resolve_async`` first
(``Runtime.start``, the doctor, the night's gate); requests and server starts
then read the cache.
"""

from __future__ import annotations

import asyncio
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from core.config import Config
from core.model.wire import FUNCTION_CALLING

AUTO = "auto"
TEMPLATE_KEY = "tokenizer.chat_template"
# Bounds for a header we parse: the file is the user's, but a broken one must fail clearly.
_MAX_KEY = 1 << 16
_MAX_STRING = 64 << 20

# GGUF value types -> size in bytes (fixed-size scalars); 8 = string, 9 = array.
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9

# Template markers -> the family, for the reason given to the user.
_FAMILIES = (("<|start_header_id|>", "Llama 3"), ("<start_of_turn>", "Gemma"),
             ("[INST]", "Mistral / Llama 2"), ("<|user|>", "Phi-3 / Zephyr"),
             ("<｜User｜>", "DeepSeek"))


@dataclass(frozen=True)
class ChatFormat:
    name: str  # what --chat_format gets, what the client and the trainer render
    reason: str  # one sentence for `python -m bot doctor`
    native: bool = True  # False: the format's turn tokens are not the model's own


class GGUFHeaderError(ValueError):
    """The file's header is not a GGUF header we can walk."""


def read_chat_template(path: Path) -> str | None:
    """The GGUF's ``tokenizer.chat_template`` (None if it has none), from the header only."""
    if Path(path).stat().st_size < 24:
        raise GGUFHeaderError(f"{path} is too short to be a GGUF file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise GGUFHeaderError(f"{path} is not a GGUF file")
        version, _, n_kv = struct.unpack_from("<IQQ", data, 4)
        if version < 2:
            raise GGUFHeaderError(f"{path}: GGUF version {version} is not supported")
        at = 24
        for _ in range(n_kv):
            key, at = _string(data, at, _MAX_KEY)
            (kind,), at = struct.unpack_from("<I", data, at), at + 4
            if key == TEMPLATE_KEY and kind == _STRING:
                return _string(data, at, _MAX_STRING)[0]
            at = _skip(data, at, kind)
    return None


def _string(data: mmap.mmap, at: int, limit: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, at)
    if length > limit or at + 8 + length > len(data):
        raise GGUFHeaderError(f"a GGUF string of {length} bytes at offset {at} is out of bounds")
    return data[at + 8:at + 8 + length].decode("utf-8", "replace"), at + 8 + length


def _skip(data: mmap.mmap, at: int, kind: int) -> int:
    if kind in _SIZES:
        return at + _SIZES[kind]
    if kind == _STRING:
        (length,) = struct.unpack_from("<Q", data, at)
        return at + 8 + length
    if kind != _ARRAY:
        raise GGUFHeaderError(f"unknown GGUF value type {kind} at offset {at}")
    item, count = struct.unpack_from("<IQ", data, at)
    at += 12
    if item in _SIZES:
        return at + _SIZES[item] * count
    for _ in range(count):  # strings (the token list) or nested arrays: one by one
        at = _skip(data, at, item)
        if at > len(data):
            raise GGUFHeaderError("a GGUF array runs past the end of the file")
    return at


def choose(template: str | None) -> ChatFormat:
    """The chat format for a GGUF whose chat template is ``template``."""
    if not template:
        return ChatFormat(FUNCTION_CALLING, "the GGUF has no chat template, so ChatML is "
                          f"assumed: {FUNCTION_CALLING}, llama-cpp-python's tool-calling format")
    if "<|im_start|>" in template:
        own_tools = " (its own tool syntax is not parsed by llama-cpp-python)" \
            if "tool" in template else ""
        return ChatFormat(FUNCTION_CALLING, "the GGUF's template is ChatML (<|im_start|>)"
                          f"{own_tools}: {FUNCTION_CALLING}, llama-cpp-python's tool-calling "
                          "format for ChatML, which the trainer renders too")
    family = next((name for mark, name in _FAMILIES if mark in template), "not ChatML")
    return ChatFormat(
        FUNCTION_CALLING,
        f"the GGUF's template is {family}, and llama-cpp-python's server parses tool calls "
        f"only in {FUNCTION_CALLING}, so that is used, with ChatML's <|im_start|> tags that "
        "are not this model's own tokens: expect weaker tool calls. Better: server.kind = "
        "\"llama-server\" (its --jinja uses the model's own template), or a plain format "
        "such as model.chat_format = \"llama-3\" for chat without tools",
        native=False)


_cache: dict[tuple[str, int, int], ChatFormat] = {}
# By what decides the served GGUF: what requests use, with no path built and no disk read.
_latest: dict[tuple, ChatFormat] = {}


def _where(config: Config) -> tuple:
    return config.model.gguf, config.model.hf_dir, config.paths.data_dir


def resolve(config: Config) -> ChatFormat:
    """The chat format for ``config``: the configured one, or for "auto" the GGUF's choice.
    Reads the GGUF's header on the first call per file version (blocking: see module doc)."""
    name = config.model.chat_format
    if name != AUTO:
        return ChatFormat(name, f"model.chat_format = {name!r} in the config")
    gguf = config.served_gguf
    try:
        stat = gguf.stat()
    except OSError:
        return ChatFormat(FUNCTION_CALLING, f"{gguf} is missing, so the default "
                          f"{FUNCTION_CALLING} is assumed until it exists")
    key = (str(gguf), stat.st_mtime_ns, stat.st_size)
    if key not in _cache:
        _cache[key] = choose(read_chat_template(gguf))
    _latest[_where(config)] = _cache[key]
    return _cache[key]


async def resolve_async(config: Config) -> ChatFormat:
    return await asyncio.to_thread(resolve, config)


def chat_format_name(config: Config) -> str:
    """The resolved name, for per-request use: from the cache once ``resolve`` has run for
    this GGUF (the runtime and the supervisor run it off the loop first)."""
    name = config.model.chat_format
    if name != AUTO:
        return name
    cached = _latest.get(_where(config))
    return cached.name if cached is not None else resolve(config).name
