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

It also installs ``bot.serving.prompt_cache``: a prompt cache that keeps one saved
state per conversation and lean state copies (see that module).

Run it with exactly the arguments of ``python -m llama_cpp.server``:
``python -m bot.serving.shim --model m.gguf --chat_format chatml-function-calling``.
"""

from __future__ import annotations

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


def main() -> None:
    plain_templates()
    from bot.serving.prompt_cache import install

    install()  # the prompt cache's state handling; inert unless --cache is on (see there)
    # As `python -m llama_cpp.server`: its own argv parsing reads sys.argv[1:].
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
