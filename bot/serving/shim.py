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

It also installs ``bot.serving.prompt_cache``: a prompt cache that keeps one saved
state per conversation and lean state copies (see that module).

Run it with exactly the arguments of ``python -m llama_cpp.server``:
``python -m bot.serving.shim --model m.gguf --chat_format chatml-function-calling``.
"""

from __future__ import annotations

import re
import runpy


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


class _Bounded:
    """A ``Llama`` as the handler sees it, whose completions of a call's arguments stop
    at ``limit`` tokens. The handler uses only ``create_completion`` and ``verbose``;
    everything else reads through."""

    def __init__(self, llama, limit: int) -> None:
        self._llama, self._limit = llama, limit

    def __getattr__(self, name: str):
        return getattr(self._llama, name)

    def create_completion(self, *args, **kwargs):
        prompt = kwargs.get("prompt", args[0] if args else None)
        if (kwargs.get("max_tokens") is None and isinstance(prompt, str)
                and _ARGUMENTS.search(prompt)):
            kwargs["max_tokens"] = self._limit
        return self._llama.create_completion(*args, **kwargs)


def bounded_calls(name: str = "chatml-function-calling") -> None:
    """Re-register ``name``'s handler so a request's ``max_tokens`` bounds each of its
    inner completions (idempotent). ``Llama`` looks the handler up at every request."""
    from llama_cpp import llama_chat_format

    handler = llama_chat_format.get_chat_completion_handler(name)
    if getattr(handler, "_nightshift_bounded", False):
        return

    def bounded(llama, *args, **kwargs):
        limit = kwargs.get("max_tokens")
        return handler(llama if limit is None else _Bounded(llama, limit), *args, **kwargs)

    bounded._nightshift_bounded = True
    llama_chat_format.LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
        name, bounded, overwrite=True)


def patch_handlers() -> None:
    """Both patches, for every process that generates as the server does (the gate too)."""
    plain_templates()
    bounded_calls()


def main() -> None:
    patch_handlers()
    from bot.serving.prompt_cache import install

    install()  # the prompt cache's state handling; inert unless --cache is on (see there)
    # As `python -m llama_cpp.server`: its own argv parsing reads sys.argv[1:].
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
