"""What serves models: the llama.cpp server's supervisor, its kinds (plain or the shim),
its watchdog, probes and log, the blue-green swap, orphaned servers, the releases
(promote, rollback), and the client that talks to a served model (``client``, ``http``).

Used by the bot and by ``python -m trainer sleep`` run by hand (which serves the live
model itself); imports ``core`` only (docs/architecture.md)."""
