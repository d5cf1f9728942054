"""Nightshift's bot: the day side. Its rooms, and who may import whom.

Top level, what drives the agent:

- ``channels``: one queue and worker per channel, each channel's tool context
  (``ChannelSpaces``), the stray end-of-turn detector;
- ``runtime``: builds everything a front end talks to, and closes it;
- ``model_pair``, ``periodic``: does the served GGUF match the trained checkpoint; a
  check run every few seconds;
- ``console``, ``app``: the local console, and the start of the bot;
- ``commands`` (the admin command table), ``admin`` (its actions), ``doctor``;
- ``swarm`` (``/swarm start``: member turns on a shared board), ``hygiene``
  (``/notes-clean``: the routine cleaning turn).
- ``labelling``: who may label an episode or have it forgotten, and those acts.

Sub-packages, one concern each:

- ``bot.agent``: one turn, the linear tool-calling loop (``loop``); ``messages`` (what
  it sends and stores), ``guards`` (template syntax, repeated calls), ``compaction``
  (the summary of older messages), ``stray`` (the question to an unfinished answer),
  ``tool_profiles`` (which tools it is offered);
- ``bot.night``: the night as seen from the bot (the trainer's job, the watch that
  follows it, the report, the sleep schedule and the rounds in progress it waits for);
- ``bot.discord_front``: the Discord front end (app, access rules, rendering, slash
  commands made from ``bot.commands``);
- ``bot.practice``: ``/practice``, given ``PracticeServices`` (``services``), not the
  runtime; ``bot.selfplay``: ``/selfplay``, proposer and solver rounds on the same.

What the day shares with the night (config, the store, the model contract, practice
sets and checks) is ``core``; what serves models (the supervisor, the swap, releases,
the client) is ``serving``. Who may import whom is docs/architecture.md's table, which
``tests/test_architecture.py`` reads and checks: ``bot`` never imports ``trainer`` or
torch (it starts ``python -m trainer`` as a process and reads the job from the store),
and no two modules import each other, not even for types.
"""
