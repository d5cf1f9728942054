"""What the day (``bot``) and the night (``trainer``) share: the contract between them.

- ``core.config``: config.toml's schema and loading, one settings object per section;
- ``core.storage``: the SQLite store (trajectories, labels, jobs, releases), its schema
  and migrations, the typed events (``core.storage.events``), the night's ledger and the
  offline embedder;
- ``core.model``: the model contract: the wire format of tool calls, the chat formats,
  special tokens, and what the llama.cpp server runs in its own process (the shim, the
  choice between words and a call, the prompt cache);
- ``core.practice``: practice sets and their checks (exact, regex, python in the sandbox).

It imports only ``sandbox`` of the project (docs/architecture.md), never torch or discord.
"""
