"""Self-play: practice whose tasks the agent writes itself.

A proposer channel asks the agent for a task it expects to do middlingly,
with a check in the practice-set format and a reference answer; the proposal
is validated in the sandbox before any solver runs; N solver channels attempt
it as real agent turns; the check scores them (verifier rewards, as practice
writes them); the mean and spread go back to the proposer, whose proposal is
rewarded for a mean near ``selfplay.target``. Middling tasks grow a practice
set whose held-out share feeds the gate.

- ``proposal``: reading a proposer's reply (leniently), and the proposer's reward;
- ``round``: one round, from the proposal to the report, and its events;
- ``keep``: the growing practice set and its held-out items;
- ``runs``: ``/selfplay start|stop``, the run as a job and a round in progress,
  and the daily schedule.
"""
