"""Nightshift's bot: the day side. Its rooms, and who may import whom.

Top level, the agent and what drives it:

- ``agent``: one turn, the linear tool-calling loop; ``messages`` (what it sends
  and stores), ``guards`` (template syntax, repeated calls), ``compaction``
  (the summary of older messages), ``stray`` (the question to an unfinished answer);
- ``channels``: one queue and worker per channel, the stray end-of-turn detector;
- ``runtime``: builds everything a front end talks to, and closes it;
- ``console``, ``app``: the local console, and the start of the bot;
- ``commands`` (the admin command table), ``admin`` (its actions), ``doctor``;
- ``swarm`` (``/swarm start``: member turns on a shared board), ``hygiene``
  (``/notes-clean``: the routine cleaning turn).
- ``labelling``: who may label an episode or have it forgotten, and those acts.

Sub-packages, one concern each:

- ``core.config``: config.toml's schema and loading;
- ``core.storage``: the SQLite store (trajectories, labels, jobs, releases),
  its schema and migrations, the night's ledger, the offline embedder;
- ``bot.serving``: the llama.cpp server (supervisor, watchdog, probes,
  kinds, swap, shim) and the client that talks to it (``client``, ``wire``);
- ``bot.night``: the night as seen from the bot (the trainer's job, the
  watch that follows it, releases: promote and rollback, the sleep schedule
  and the rounds in progress it waits for);
- ``bot.discord_front``: the Discord front end (app, access rules, rendering,
  slash commands made from ``bot.commands``);
- ``bot.selfplay``: ``/selfplay``: proposer and solver rounds on practice's
  checks, the proposer's reward, the growing self-play practice set.

Import rules (``tests/test_layout.py`` checks them):

- ``sandbox`` is a leaf; ``tools`` imports ``sandbox``; ``bot`` imports
  ``tools`` and ``sandbox``;
- ``bot`` never imports ``trainer``, torch or transformers: it starts
  ``python -m trainer`` as a process and reads the job from the store;
- ``trainer`` imports only ``core.config``, ``core.storage.store``,
  ``core.storage.embedder``, ``core.model.wire``,
  ``core.model.chat_format``, ``core.model.shim`` (the gate generates as the
  server does), ``core.practice.sets`` and ``core.practice.checks`` (the gate's
  held-out items, their checks run in the sandbox), all free of discord and
  torch;
- ``core.storage``, ``bot.serving`` and ``bot.night`` never import the
  runtime, the front ends or each other's callers; nothing imports inside a
  function to dodge a cycle (imports inside functions are only for heavy or
  optional dependencies that load when used).
"""
