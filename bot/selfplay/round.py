"""One self-play round: propose, validate, solve, score, report, reward, keep.

Channels (fresh per run, so no run sees another's history):

- ``selfplay-<run>-proposer``: the proposer. Its system prompt has the
  self-play section (``PROPOSER_SECTION``, a prompt hook of the self-play
  agent only), and the rounds of one run follow each other there, so the
  report of round 1 is in the context of round 2's proposal;
- ``selfplay-<run>-r<round>-check<try>``: a scratch workspace where a
  proposal's check is tried on a dummy answer and on the reference;
- ``selfplay-<run>-r<round>-s<k>``: solver k, a fresh channel like practice.

Validation comes before any solver runs: the reply parses
(``bot.selfplay.proposal``); the check runs in the sandbox on a dummy answer
without crashing, returns a number in [0, 1] and does not pass it; the
reference answer passes (``selfplay.pass_reward``). Otherwise the reason goes
back as the next user message of the proposer channel, up to
``selfplay.max_tries`` proposals a round.

Events, per episode (the trainer reads ``verifier_reward``; the rest is for
people and reports):

- ``selfplay``: ``{"role": "proposer"|"solver", "round", "run", "task",
  "step": "proposal"|"report"|"attempt", "try"}``: the trajectory's label;
- ``verifier_reward`` on each solver episode, as practice writes it (check
  ``selfplay-<kind>``, group ``selfplay:<task>:<run>-<round>``), unjudged
  when the check crashed or timed out, when the turn hit a harness error, or
  when the task is kept and falls in the held-out share (the gate's items are
  never trained on);
- ``verifier_reward`` on each proposal episode, check ``selfplay-proposer``:
  ``proposer_reward`` (0 for an invalid proposal).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

from bot.agent.loop import TurnResult
from bot.channels import ChannelWorkers
from bot.practice.runner import attempt_verdict
from bot.practice.services import PracticeServices
from bot.selfplay.keep import in_set, is_middling, keep_task
from bot.selfplay.proposal import FORMAT, Proposal, ProposalError, parse_proposal, \
    proposer_reward
from core.practice.checks import Verdict, judge
from core.practice.sets import is_held_out
from core.storage.events import CheckResult, Event

logger = logging.getLogger("nightshift.selfplay")
DUMMY_ANSWER = "I don't know."
CANNOT_RUN = "the check cannot run"  # core.practice.checks' verdict without a sandbox
PROPOSER_CHECK = "selfplay-proposer"
PROPOSER_SECTION = (
    "Self-play: you are the proposer. Invent one task that you expect to solve about half of "
    "the time: not trivial, not impossible. Another copy of you will solve it with the same "
    "tools, and only its final answer is checked. Answer with one JSON object:\n" + FORMAT +
    "\nThe check is {\"python\": CODE} defining reward(answer, workspace) that returns a number "
    "from 0 to 1 (answer is the solver's final answer as a string, workspace the path of its "
    "folder), or {\"exact\": TEXT}, or {\"regex\": PATTERN} matching the whole answer. The "
    "reference is an answer that passes your check; a wrong answer must not pass.")


class CannotCheck(Exception):
    """No check can run here (no sandbox): the round ends, and nobody is rewarded."""


@dataclass
class Outcome:
    """What one round found, for the report and the run's summary."""

    number: int
    proposal: Proposal | None = None
    tries: int = 0
    rewards: list[float] = field(default_factory=list)  # judged solver rewards
    unjudged: int = 0
    proposer: float | None = None  # the valid proposal's reward
    kept: bool = False
    held_out: bool = False
    error: str = ""  # why the round ended without solvers

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.rewards) if self.rewards else None

    @property
    def spread(self) -> float | None:
        return statistics.pstdev(self.rewards) if self.rewards else None

    def line(self) -> str:
        if self.proposal is None:
            return f"round {self.number}: no valid task after {self.tries} tries ({self.error})"
        mean = "n/a" if self.mean is None else f"{self.mean:.2f} ± {self.spread:.2f}"
        reward = "unjudged" if self.proposer is None else f"{self.proposer:.2f}"
        kept = " kept" + (" (held out for the gate)" if self.held_out else "") if self.kept else ""
        return (f"round {self.number}: task {self.proposal.id} (try {self.tries}), solver mean "
                f"{mean} over {len(self.rewards)} judged" +
                (f", {self.unjudged} unjudged" if self.unjudged else "") +
                f"; proposer reward {reward};{kept or ' not kept'}")


class Round:
    """One round of run ``run``; ``play`` does it all and returns its Outcome."""

    def __init__(self, rt: PracticeServices, workers: ChannelWorkers, run: int, number: int,
                 solvers: int) -> None:
        self.rt, self.workers = rt, workers
        self.settings = rt.config.selfplay
        self.run, self.number, self.solvers = run, number, solvers
        self.proposer = proposer_channel(run)
        self.outcome = Outcome(number)

    async def play(self) -> Outcome:
        proposal, episodes = await self._propose()
        if proposal is None:
            return self.outcome
        verdicts = await asyncio.gather(*(self._solve(proposal, k) for k in range(self.solvers)))
        out = self.outcome
        out.rewards = [v.reward for v, _ in verdicts if v.judged]
        out.unjudged = sum(not v.judged for v, _ in verdicts)
        out.kept = is_middling(out.mean, self.settings.target, self.settings.keep_band)
        out.held_out = await self._held_out(proposal)
        for k, (verdict, episode) in enumerate(verdicts):
            await self._solver_reward(proposal, k, verdict, episode)
        out.proposer = proposer_reward(out.mean, self.settings.target, True)
        await self._proposer_reward(episodes[-1], proposal.id, out.proposer,
                                    "" if out.proposer is not None else "no solver attempt "
                                    "was judged")
        if out.kept:
            await self._keep(proposal)
        await self._report()
        return out

    # -- the proposer -------------------------------------------------------------

    async def _propose(self) -> tuple[Proposal | None, list[int]]:
        """Ask until a proposal validates or the tries are spent; every invalid
        proposal's episode gets the invalid reward (0) as it is found invalid."""
        message = f"Self-play round {self.number}: propose one task (JSON, as your section says)."
        episodes: list[int] = []
        for attempt in range(1, self.settings.max_tries + 1):
            self.outcome.tries = attempt
            result = await self._proposer_turn(message, attempt, "proposal")
            if result is None:
                return None, episodes
            episodes.append(result.episode_id)
            try:
                why = await self._check_proposal(result)
            except CannotCheck as exc:  # the harness's failure, not the proposer's: no reward
                self.outcome.error = str(exc)
                await self._proposer_reward(result.episode_id, "", None, str(exc))
                return None, episodes
            if isinstance(why, Proposal):
                self.outcome.proposal = why
                return why, episodes
            await self._proposer_reward(result.episode_id, "", 0.0, "", invalid=why)
            self.outcome.error = why
            left = self.settings.max_tries - attempt
            message = (f"Your proposal cannot be used: {why}\n" +
                       (f"Fix it and answer again with one JSON object ({left} "
                        f"{'try' if left == 1 else 'tries'} left)." if left else
                        "No tries are left this round."))
        if self.outcome.error:  # the last observation, recorded where the proposer sees it
            await self._proposer_turn(message, self.settings.max_tries + 1, "report")
        return None, episodes

    async def _proposer_turn(self, text: str, attempt: int, step: str) -> TurnResult | None:
        try:
            result = await self.workers.submit(self.proposer, text, "selfplay")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a harness bug: the round cannot go on
            logger.exception("self-play proposer turn failed")
            self.outcome.error = f"the proposer's turn failed: {exc}"
            return None
        await self._label(self.proposer, result.episode_id, "proposer", step, attempt)
        if not result.ok and await self._status(self.proposer, result.episode_id) != "aborted":
            self.outcome.error = f"the proposer's turn ended in an error: {result.reply[:200]}"
            return None  # a server error says nothing about the proposer: no reward
        return result

    async def _check_proposal(self, result: TurnResult) -> Proposal | str:
        """The proposal, or why it is invalid (the observation to send)."""
        if not result.ok:  # aborted: the step limit, or malformed tool calls in a row
            return ("your turn stopped at a limit before a final answer. Reply with the JSON "
                    f"object itself (no tool is needed), like: {FORMAT}")
        try:
            proposal = await asyncio.to_thread(parse_proposal, result.reply)
        except ProposalError as exc:
            return str(exc)
        channel = f"selfplay-{self.run}-r{self.number}-check{self.outcome.tries}"
        try:
            return await self._judge_proposal(proposal, self.rt.context(channel))
        finally:
            await self.rt.retire(channel)  # checked: its workspace may be reclaimed

    async def _judge_proposal(self, proposal: Proposal, ctx: Any) -> Proposal | str:
        """The proposal if its check fails a dummy answer and passes its reference."""
        task, sandbox = proposal.task(), ctx.services.sandbox
        timeout = self.rt.config.practice.check_timeout_s
        dummy = await judge(task, DUMMY_ANSWER, ctx.workspace, sandbox, timeout)
        if not dummy.judged and dummy.why.startswith(CANNOT_RUN):
            raise CannotCheck(dummy.why)
        if not dummy.judged:
            return f"on a dummy answer ({DUMMY_ANSWER!r}) {dummy.why}"
        passing = self.settings.pass_reward
        if dummy.reward >= passing:
            return (f"the check gives {dummy.reward:g} to a dummy answer ({DUMMY_ANSWER!r}); "
                    "it must fail wrong answers")
        reference = await judge(task, proposal.reference, ctx.workspace, sandbox, timeout)
        if not reference.judged:
            return f"on your reference answer {reference.why}"
        if reference.reward < passing:
            return (f"your reference answer {proposal.reference[:200]!r} gets {reference.reward:g}"
                    f" from your check; it must get at least {passing:g}")
        return proposal

    async def _report(self) -> None:
        """The mean and spread, as a message the proposer sees (and answers)."""
        out = self.outcome
        mean = "n/a" if out.mean is None else f"{out.mean:.2f}"
        spread = "n/a" if out.spread is None else f"{out.spread:.2f}"
        reward = "none (no attempt was judged)" if out.proposer is None else f"{out.proposer:.2f}"
        text = (f"Self-play report, round {self.number}: {self.solvers} solvers tried your task; "
                f"mean reward {mean}, spread {spread}, over {len(out.rewards)} judged attempts"
                f" ({out.unjudged} unjudged). Your reward: {reward} (best when the mean is near "
                f"{self.settings.target:g}). Say in one line what you will change next time.")
        await self._proposer_turn(text, out.tries, "report")

    # -- the solvers --------------------------------------------------------------

    async def _solve(self, proposal: Proposal, k: int) -> tuple[Verdict, int | None]:
        channel = f"selfplay-{self.run}-r{self.number}-s{k}"
        try:
            result = await self.workers.submit(channel, proposal.prompt, "selfplay")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a harness bug in this turn: the attempt cannot be judged
            logger.exception("self-play solver %s failed", channel)
            return Verdict(None, f"the turn failed: {exc}"), None
        await self._label(channel, result.episode_id, "solver", "attempt", 1, proposal.id)
        return await attempt_verdict(self.rt, channel, proposal.task(), result), result.episode_id

    async def _solver_reward(self, proposal: Proposal, k: int, verdict: Verdict,
                             episode: int | None) -> None:
        channel = f"selfplay-{self.run}-r{self.number}-s{k}"
        if self.outcome.held_out:  # the gate's item: never trained on
            verdict = Verdict(None, "held out for the gate: never trained on")
        result = CheckResult(f"selfplay-{proposal.check.kind}",
                             verdict.reward if verdict.judged else None, proposal.id,
                             f"selfplay:{proposal.id}:{self.run}-{self.number}",
                             "" if verdict.judged else verdict.why,
                             {"set": "selfplay", "role": "solver", "round": self.number,
                              "run": self.run})
        await self.rt.store.add_event(channel, episode, Event.VERIFIER_REWARD, result.payload())
        await self.rt.retire(channel)  # judged: its workspace may be reclaimed

    # -- records ------------------------------------------------------------------

    async def _held_out(self, proposal: Proposal) -> bool:
        """Whether the task is (or is about to be) a held-out item of the kept set: a
        task kept earlier stays the gate's even when this round found it easy or hard."""
        if not is_held_out(proposal.id, self.rt.config.practice.held_out_percent):
            return False
        if self.outcome.kept:
            return True
        try:
            return await asyncio.to_thread(in_set, self.rt.config.data_dir, proposal.id)
        except (OSError, ValueError) as exc:  # unreadable: never risk training on the gate's item
            logger.error("self-play cannot read its set: %s", exc)
            return True

    async def _keep(self, proposal: Proposal) -> None:
        try:
            await asyncio.to_thread(keep_task, self.rt.config.data_dir, proposal,
                                    self.rt.config.practice.held_out_percent)
        except (OSError, ValueError) as exc:  # the round's rewards stand; the set is told
            logger.error("self-play could not keep task %s: %s", proposal.id, exc)
            self.outcome.kept = False

    async def _proposer_reward(self, episode: int, task: str, reward: float | None, error: str,
                               invalid: str = "") -> None:
        extra = {"role": "proposer", "round": self.number, "run": self.run, "valid": not invalid}
        if invalid:
            extra["invalid"] = invalid
        result = CheckResult(PROPOSER_CHECK, reward, task, error=error, extra=extra)
        await self.rt.store.add_event(self.proposer, episode, Event.VERIFIER_REWARD,
                                      result.payload())

    async def _label(self, channel: str, episode: int, role: str, step: str, attempt: int,
                     task: str = "") -> None:
        await self.rt.store.add_event(channel, episode, Event.SELFPLAY, {
            "role": role, "round": self.number, "run": self.run, "task": task, "step": step,
            "try": attempt})

    async def _status(self, channel: str, episode: int) -> str:
        return await self.rt.store.episode_status(episode) or "errored"


def proposer_channel(run: int) -> str:
    return f"selfplay-{run}-proposer"
