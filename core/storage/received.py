"""The bot's side of the history: the steps the store's writer process sent it lately.

A history read answered from the writer's memory (``core.storage.history``)
comes back as step ids alone, and the bot looks them up here: unpickling
twenty steps on every turn cost the bot's loop more than moving the writes
out of its process saved (bench/agent.py). Most of those steps were sent to
the bot whole a moment before, as the result of the write that stored them
or in an earlier whole read. Not all: the writer's memory also holds steps
that another connection wrote, or older ones than this keeps. An id missing
here makes ``Store.channel_history`` ask again for the steps themselves, so
what is kept here makes reads cheaper, never decides what they say.

Erased text does not stay: a whole read replaces what is kept for its
channel over the ids it spans (the writer's memory is emptied whenever
another connection writes, so the first read after a ``/forget`` anywhere is
whole), and this process's own ``/forget`` clears everything at once.
"""

from __future__ import annotations

from collections import OrderedDict

from core.storage.schema import StoredStep


class Received:
    def __init__(self, keep: int = 128, channels: int = 512) -> None:
        self.keep, self.channels = keep, channels
        self._by_channel: OrderedDict[str, OrderedDict[int, StoredStep]] = OrderedDict()
        self.hits = self.misses = 0  # reads answered by ids found here, or not: for tests

    def add(self, steps: list[StoredStep]) -> None:
        """Steps a write stored, as the writer sent them."""
        for step in steps:
            kept = self._channel(step.channel_id)
            kept[step.id] = step
            kept.move_to_end(step.id)
            if len(kept) > self.keep:
                kept.popitem(last=False)

    def replace(self, channel_id: str, steps: list[StoredStep], limit: int) -> None:
        """A whole read of the channel's latest ``limit`` steps: within the ids it spans,
        what it says is all that is kept (a step it leaves out was forgotten, its text
        erased). An empty read of ``limit`` 0 spans nothing."""
        kept = self._by_channel.get(channel_id)
        if kept is not None and (steps or limit > 0):
            low = steps[0].id if steps else -1
            shown = {step.id for step in steps}
            for gone in [i for i in kept if i >= low and i not in shown]:
                del kept[gone]
        self.add(steps)

    def steps(self, channel_id: str, ids: list[int]) -> list[StoredStep] | None:
        """The steps with these ids, in that order, or None if any is not kept."""
        kept = self._by_channel.get(channel_id, {})
        if channel_id in self._by_channel:
            self._by_channel.move_to_end(channel_id)
        try:
            found = [kept[i] for i in ids]
        except KeyError:
            self.misses += 1
            return None
        self.hits += 1
        return found

    def clear(self) -> None:
        self._by_channel.clear()

    def _channel(self, channel_id: str) -> OrderedDict[int, StoredStep]:
        kept = self._by_channel.get(channel_id)
        if kept is None:
            kept = self._by_channel[channel_id] = OrderedDict()
            while len(self._by_channel) > self.channels:
                self._by_channel.popitem(last=False)
        return kept
