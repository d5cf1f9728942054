"""The admin commands, as one table: name, arguments, help and handler.

Discord's slash commands (``bot.discord_front.slash``), the console and its
``/help`` are all made from ``COMMANDS``, and every front end runs a command
through ``run_command``, which holds the one permission check and the one
error policy:

- a caller who is not an admin gets ``REFUSAL`` and nothing runs, unless the
  command has its own rule (``Command.also_allowed``): ``/forget`` is open to
  the episode's author too, and refuses others with its own text;
- bad arguments (``CommandError``, ``ValueError``) get the command's usage;
- any other exception is logged and answered as ``"NAME failed: why"``; the
  front end and the bot keep going.

Adding a command is one entry here, plus its action (usually in ``bot.admin``).
Permission is checked in code against the configured admin users and roles:
Discord's ``default_permissions`` alone would guard nothing, since any server
admin can change it.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bot import admin, hygiene, labelling
from bot.practice.runner import run_practice
from core.config import Config

if TYPE_CHECKING:
    from bot.runtime import Runtime

logger = logging.getLogger("nightshift.commands")
REFUSAL = "Sorry, only Nightshift's admins can use this command."


@dataclass(frozen=True)
class Caller:
    """Who runs a command, and in which agent channel (its key).

    ``local`` is the person at the console: the machine's owner, an admin by
    definition."""

    user_id: int
    role_ids: tuple[int, ...]
    channel: str
    name: str
    local: bool = False


@dataclass(frozen=True)
class Arg:
    name: str
    type: type  # int, str or FilePath
    help: str
    required: bool = True
    choices: tuple[str, ...] = ()


class FilePath(str):
    """An argument that names a file on the bot's machine. On Discord the file may
    instead be attached to the command; the front end saves it and passes its path."""


Handler = Callable[..., Awaitable[str]]  # (runtime, caller, **arguments) -> the answer


@dataclass(frozen=True)
class Command:
    name: str  # "sys show" is the subcommand "show" of the group "sys"
    help: str
    handler: Handler
    args: tuple[Arg, ...] = ()
    # Besides admins, who may run it: (runtime, caller, options) -> bool. None: admins only.
    also_allowed: Callable[..., Awaitable[bool]] | None = None
    refusal: str = REFUSAL
    who: str = "admins"  # for the help texts

    @property
    def usage(self) -> str:
        parts = [f"/{self.name}"]
        for arg in self.args:
            label = "|".join(arg.choices) if arg.choices else arg.name.upper()
            parts.append(label if arg.required else f"[{label}]")
        return " ".join(parts)


@dataclass(frozen=True)
class Answer:
    text: str
    refused: bool = False


class CommandError(ValueError):
    """A command line or its arguments are malformed; the text says how to fix it."""


async def _episode_author(rt: Runtime, caller: Caller, episode_id: int = 0, **_: Any) -> bool:
    return await labelling.may_handle(rt.store, episode_id, caller.user_id, admin=False)


_RELEASE = Arg("release_id", int, "the release's id", required=False)
COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("status", "model, server health, queues, the night and the disk",
            lambda rt, c: admin.status(rt.store, rt.supervisor, rt.workers, rt.spaces,
                                       c.channel)),
    Command("sleep", "start the night: train on the day",
            lambda rt, c: admin.sleep(rt.store, rt.night, rt.agent, c.name, c.channel)),
    Command("wake", "cancel a queued or running night", lambda rt, c: admin.wake(rt.store)),
    Command("promote", "serve a candidate release (the newest if no id is given)",
            lambda rt, c, release_id=None: admin.promote(rt.releases, release_id), (_RELEASE,)),
    Command("rollback", "serve the release that served before (or the one named)",
            lambda rt, c, release_id=None: admin.rollback(rt.releases, release_id),
            (_RELEASE,)),
    Command("history", "the release chain, with each release's gate figures",
            lambda rt, c: rt.reports.history_command()),
    Command("report", "a night's report: data, rewards, training, gate (the newest if no "
            "night is given)", lambda rt, c, night=None: rt.reports.report_command(night),
            (Arg("night", int, "the night's job id", required=False),)),
    Command("label", "label an episode for the night",
            lambda rt, c, episode_id, label: admin.label(rt.store, episode_id, label, "admin"),
            (Arg("episode_id", int, "the episode's id"),
             Arg("label", str, "the label to give it",
                 choices=("accepted", "rejected", "verified")))),
    Command("forget", "exclude an episode from training and erase its text",
            lambda rt, c, episode_id: labelling.forget(rt.store, episode_id, c.user_id,
                                                       admin=True, spaces=rt.spaces),
            (Arg("episode_id", int, "the episode's id"),),
            also_allowed=_episode_author, who="admins, or the episode's author",
            refusal=("Sorry, only the person whose message started that episode, or an "
                     "admin, may forget it.")),
    Command("sys show", "show this channel's agent-editable system section",
            lambda rt, c: admin.sys_show(rt.spaces, c.channel)),
    Command("sys reset", "reset this channel's agent-editable system section",
            lambda rt, c: admin.sys_reset(rt.workers, rt.spaces, c.channel)),
    Command("restart-server", "restart the model server",
            lambda rt, c: admin.restart_server(rt.supervisor)),
    Command("notes-clean", "routine cleaning: the agent merges and deletes redundant notes",
            lambda rt, c: hygiene.routine_clean(rt.spaces.services.notes,
                                                rt.registry.names(), rt.turn, c.channel)),
    Command("notes-wipe", "delete every note of this channel, no undo (type CONFIRM)",
            lambda rt, c, confirm=None: admin.notes_wipe(rt.spaces, c.channel, confirm),
            (Arg("confirm", str, "the word CONFIRM", required=False),)),
    Command("swarm start", "post a task to a swarm's board and start its channels on it",
            lambda rt, c, swarm, task: rt.swarms.start(swarm, task),
            (Arg("swarm", str, "the swarm's name (config [swarms])"),
             Arg("task", str, "the task, in quotes on the console"))),
    Command("swarm stop", "clear a swarm's task from its members' prompts",
            lambda rt, c, swarm: rt.swarms.stop(swarm), (Arg("swarm", str, "the swarm's name"),)),
    Command("practice", "practise a set of checked tasks (a JSONL file on the bot's machine)",
            lambda rt, c, file, samples=None: run_practice(rt.practice, file, samples),
            (Arg("file", FilePath, "the practice set: a JSONL file of {id, prompt, check}"),
             Arg("samples", int, "attempts per task (default: practice.samples)",
                 required=False))),
    Command("selfplay start", "self-play: the agent proposes tasks with checks, solvers try them",
            lambda rt, c, rounds=None, solvers=None: rt.selfplay.start(rounds, solvers, c.channel),
            (Arg("rounds", int, "rounds to play (default: selfplay.rounds)", required=False),
             Arg("solvers", int, "solver attempts per task (default: selfplay.solvers)",
                 required=False))),
    Command("selfplay stop", "stop the running self-play", lambda rt, c: rt.selfplay.stop()),
)}


def is_admin(config: Config, user_id: int, role_ids: Iterable[int] = ()) -> bool:
    if user_id in config.discord.admin_user_ids:
        return True
    return bool(set(role_ids) & set(config.discord.admin_role_ids))


def may_run(config: Config, caller: Caller) -> bool:
    return caller.local or is_admin(config, caller.user_id, caller.role_ids)


async def permitted(rt: Runtime, caller: Caller, name: str, **options: Any) -> bool:
    """An admin may run every command; a command's own rule may let others run it."""
    if may_run(rt.config, caller):
        return True
    rule = COMMANDS[name].also_allowed
    return rule is not None and await rule(rt, caller, **options)


async def run_command(rt: Runtime, caller: Caller, name: str, **options: Any) -> Answer:
    """Check that ``caller`` may run the command ``name``, then run it."""
    command = COMMANDS[name]
    if not await permitted(rt, caller, name, **options):
        logger.info("refused %s to %s", name, caller.name)
        return Answer(command.refusal, refused=True)
    logger.info("%s runs %s %s in #%s", caller.name, name, options or "", caller.channel)
    try:
        return Answer(await command.handler(rt, caller, **options))
    except asyncio.CancelledError:
        raise
    except ValueError as exc:  # CommandError included: the caller can fix it
        return Answer(f"{name}: {exc}\nusage: {command.usage}")
    except Exception as exc:  # an admin sees why; the front end and the bot keep going
        logger.exception("admin command %s failed", name)
        return Answer(f"{name} failed: {exc}")


def parse_command(line: str) -> tuple[str, dict[str, Any]]:
    """A typed command line (``/promote 3``) as (name, options); raises CommandError."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise CommandError(f"cannot read {line!r}: {exc}") from None
    if not words:
        raise CommandError("empty command; /help lists the commands")
    first = words[0].lstrip("/!")
    for size in (2, 1):  # a subcommand ("sys show") first
        name = " ".join([first, *words[1:size]])
        if name in COMMANDS and len(words) >= size:
            return name, _options(COMMANDS[name], words[size:])
    raise CommandError(f"unknown command {words[0]!r}; /help lists the commands")


def _options(command: Command, words: list[str]) -> dict[str, Any]:
    words = _named_last(command, words)
    if len(words) > len(command.args):
        raise CommandError(f"too many arguments; usage: {command.usage}")
    options: dict[str, Any] = {}
    for i, arg in enumerate(command.args):
        if i >= len(words):
            if arg.required:
                raise CommandError(f"{arg.name} is missing; usage: {command.usage}")
            continue
        options[arg.name] = _value(command, arg, words[i])
    return options


def _named_last(command: Command, words: list[str]) -> list[str]:
    """``--samples 8`` as the positional word of its argument (``/practice F --samples 8``)."""
    names = [arg.name for arg in command.args]
    if not any(w.startswith("--") and w[2:] in names for w in words):
        return words
    positional, named = [], {}
    it = iter(words)
    for word in it:
        if word.startswith("--") and word[2:] in names:
            value = next(it, None)
            if value is None:
                raise CommandError(f"{word} needs a value; usage: {command.usage}")
            named[word[2:]] = value
        else:
            positional.append(word)
    ordered = []
    for i, name in enumerate(names):
        if name in named:
            ordered.append(named[name])
        elif positional:
            ordered.append(positional.pop(0))
        elif set(names[i + 1:]) & set(named):
            raise CommandError(f"{name} is missing; usage: {command.usage}")
        else:
            break
    if positional:
        raise CommandError(f"too many arguments; usage: {command.usage}")
    return ordered


def _value(command: Command, arg: Arg, word: str) -> Any:
    if arg.choices and word not in arg.choices:
        raise CommandError(f"{arg.name} must be one of {', '.join(arg.choices)}, not {word!r}; "
                           f"usage: {command.usage}")
    if arg.type is int:
        try:
            return int(word)
        except ValueError:
            raise CommandError(f"{arg.name} must be a whole number, not {word!r}; "
                               f"usage: {command.usage}") from None
    return word


def help_lines() -> list[str]:
    """One line per command, for the console's /help (and any front end's)."""
    width = max(len(c.usage) for c in COMMANDS.values()) + 2
    return [f"{c.usage:<{width}}{c.help} ({c.who})" for c in COMMANDS.values()]
