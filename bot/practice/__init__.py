"""Practice sets: teaching the bot a skill with checks.

- ``sets``: reading a practice set (a JSONL file of ``{"id", "prompt", "check"}``
  tasks) with errors that name the line, and its deterministic held-out split.
  It imports only the standard library, so the trainer's gate may use it.
- ``checks``: the ``exact``, ``regex`` and ``python`` checks. The regex and the
  reward function run in the sandbox, under a timeout; a check that crashes,
  times out or returns garbage leaves the attempt unjudged, never 0 or 1.
- ``runner``: ``/practice FILE [--samples G]``: each practised task G times in
  fresh channels through the real agent, each attempt's verdict recorded as a
  ``verifier_reward`` event for the night (``reward`` None when unjudged).
"""
