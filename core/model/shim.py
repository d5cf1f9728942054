"""``python -m llama_cpp.server``, but with chat templates rendered without HTML escaping.

Why: llama-cpp-python 0.3.36's ``chatml-function-calling`` handler builds its
Jinja environment with ``autoescape=select_autoescape(["html", "xml"])``, which
for a template made ``from_string`` means autoescape on. Every string the model
reads is then HTML-escaped: its own earlier tool call ``{"path": "a.txt"}``
comes back as ``{&#34;path&#34;: &#34;a.txt&#34;}`` and a file holding
``x < y`` as ``x &lt; y``. A small model imitates what it reads (the 135M model
was seen to generate ``"a.txt&#34;&#34;"``).

What is patched: the name ``ImmutableSandboxedEnvironment`` in the module
namespace of ``llama_cpp.llama_chat_format``, replaced by a subclass that
forces ``autoescape=False``. The handlers look that name up in the module's
globals each time they render, so the patch reaches them; the other templates
in that module never turned autoescape on, so for them nothing changes.
Nothing else is touched: the sandbox, ``StrictUndefined`` and the templates
stay as they are.

Jinja's ``tojson`` filter (the handler's tool list) still escapes ``<>&'`` as
``\\u003c``, ``\\u003e``, ``\\u0026``, ``\\u0027`` and sorts the keys: it calls
``htmlsafe_json_dumps`` whatever the autoescape setting. That is valid JSON
and is left alone.

And ``bounded_calls``: that handler generates a tool call's arguments with no token
limit (``max_tokens=None`` on its inner completions, whatever the request said), so a
small model that writes an endless argument (a number or a string that never closes)
fills the whole context before the request fails: minutes of grammar-constrained
sampling on a CPU (a night's gate was seen spending over ten minutes on two such
items). The handler is re-registered wrapped so that its inner completions stop at the
request's ``max_tokens``; a cut argument is invalid JSON, which the agent answers as a
format error, as it answers any malformed call.

The same wrapper makes the handler's choice between words and a call on whole options,
at the request's temperature (``core.model.choice`` says why: greedy decoding under
the choice grammar compares first tokens only, and chose a tool for "What is 3 times
9?").

It also installs ``core.model.prompt_cache``: a prompt cache that keeps one saved
state per conversation and lean state copies (see that module).

And ``plain_cpu_buffers``: on a CPU with AMX, llama.cpp repacks q8_0 weights into its
AMX buffer type, and on the 2-core Xeon machines here its matrix product then segfaults
on the first prompt of more than one token (ggml's ``ggml_backend_amx_mul_mat``, a known
machine-dependent crash that upstream closed without a fix). Weights stay in plain CPU
buffers there (``use_extra_bufts`` off); elsewhere nothing changes.

Run it with exactly the arguments of ``python -m llama_cpp.server``:
``python -m core.model.shim --model m.gguf --chat_format chatml-function-calling``.
"""

from __future__ import annotations

import random
import re
import runpy
from pathlib import Path

from core.model.choice import choose


def plain_templates() -> None:
    """Turn autoescape off in llama_cpp.llama_chat_format's templates (idempotent)."""
    from llama_cpp import llama_chat_format

    base = llama_chat_format.ImmutableSandboxedEnvironment
    if getattr(base, "_nightshift_plain", False):
        return

    class PlainSandboxedEnvironment(base):
        _nightshift_plain = True

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "autoescape": False})

    llama_chat_format.ImmutableSandboxedEnvironment = PlainSandboxedEnvironment


# The prompt of the handler's completion that writes a call's arguments ends with the
# call's head; its other unbounded completions (the choice between a call and words, the
# next call's name) are a few grammar-constrained tokens and keep their own stop.
_ARGUMENTS = re.compile(r"functions\.[^\s:]+:\n\Z")


class _Handled:
    """A ``Llama`` as the handler sees it: its completions of a call's arguments stop at
    ``limit`` tokens (when the request set one), and its choice between words and a
    call is made on whole options at the request's temperature (``core.model.choice``).
    The handler uses only ``create_completion`` and ``verbose``; everything else reads
    through."""

    def __init__(self, llama, limit: int | None, temperature: float, seed: int | None) -> None:
        self._llama, self._limit, self._temperature = llama, limit, temperature
        self._rng = random.Random(seed)

    def __getattr__(self, name: str):
        return getattr(self._llama, name)

    def create_completion(self, *args, **kwargs):
        prompt = kwargs.get("prompt", args[0] if args else None)
        if isinstance(prompt, str) and kwargs.get("max_tokens") is None:
            chosen = choose(self._llama, prompt, kwargs.get("grammar"), self._temperature,
                            self._rng)
            if chosen is not None:
                return chosen
            if self._limit is not None and _ARGUMENTS.search(prompt):
                kwargs["max_tokens"] = self._limit
        return self._llama.create_completion(*args, **kwargs)


def bounded_calls(name: str = "chatml-function-calling") -> None:
    """Re-register ``name``'s handler so a request's ``max_tokens`` bounds each of its
    inner completions, and its choice is made on whole options (idempotent). ``Llama``
    looks the handler up at every request."""
    from llama_cpp import llama_chat_format

    handler = llama_chat_format.get_chat_completion_handler(name)
    if getattr(handler, "_nightshift_bounded", False):
        return

    def bounded(llama, *args, **kwargs):
        served = _Handled(llama, kwargs.get("max_tokens"), kwargs.get("temperature", 0.2),
                          kwargs.get("seed"))
        return handler(served, *args, **kwargs)

    bounded._nightshift_bounded = True
    llama_chat_format.LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
        name, bounded, overwrite=True)


def has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU advertises AMX (the flags ``amx_tile``/``amx_int8``)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(flag.startswith("amx_") for line in text.splitlines()
               if line.startswith("flags") for flag in line.split())


def plain_cpu_buffers() -> None:
    """On an AMX CPU, load every model with ``use_extra_bufts`` off (idempotent): the
    ``Llama`` class reads its defaults from this function at each load."""
    from llama_cpp import llama_cpp

    defaults = llama_cpp.llama_model_default_params
    if getattr(defaults, "_nightshift_plain", False) or not has_amx():
        return

    def plain_defaults():
        params = defaults()
        params.use_extra_bufts = False
        return params

    plain_defaults._nightshift_plain = True
    llama_cpp.llama_model_default_params = plain_defaults


def patch_handlers() -> None:
    """The patches, for every process that generates as the server does (the gate too)."""
    plain_templates()
    bounded_calls()
    plain_cpu_buffers()


def main() -> None:
    patch_handlers()
    from core.model.prompt_cache import install

    install()  # the prompt cache's state handling; inert unless --cache is on (see there)
    # As `python -m llama_cpp.server`: its own argv parsing reads sys.argv[1:].
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
