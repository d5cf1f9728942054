"""The night report on Discord (dpytest): the text in the night's channel, with its plots
attached as PNGs, sent once when the night watch sees the night finished."""

from __future__ import annotations

import json

from bot.night.plots import SERIES_KEY
from tests.discord_helpers import discord_env_fixture, sent_messages  # noqa: F401 - fixture
from tests.test_night_report import PNG_MAGIC, plant_gate, planted_progress, png_text_chunks


async def test_a_finished_night_sends_its_report_with_the_plots_attached(discord_env):
    h = await discord_env([])
    rt = h.rt
    job_id = await rt.store.create_job("sleep", {"channel": str(h.general.id)})
    progress = planted_progress(job_id)
    progress["gate"]["reasons"] = ["a long reason " * 200]  # the text needs two messages
    await plant_gate(rt, job_id, progress)
    await rt.night.poll()
    sent = [m for m in sent_messages() if m.channel.id == h.general.id]
    # The report's text (split at Discord's limit), then its plots in a message of their
    # own; the watch's progress line may come before it.
    start = next(i for i, m in enumerate(sent) if m.content.startswith(f"**Night #{job_id} "))
    texts, plots = sent[start:-1], sent[-1]
    assert len(texts) >= 2 and all(0 < len(m.content) <= 2000 for m in texts)
    assert not any(m.attachments for m in texts)
    assert "Before → after per family: arith 0.30 → 0.60" in "".join(m.content for m in texts)
    assert texts[-1].content.endswith(f"Release: #1 night-{job_id:04d} (candidate).")
    assert [a.filename for a in plots.attachments] == ["rewards.png", "loss.png", "heldout.png"]
    data = await plots.attachments[1].read()
    assert data[:8] == PNG_MAGIC
    assert json.loads(png_text_chunks(data)[SERIES_KEY])["total"] == [1.1, 0.79, 0.58]

    await rt.night.poll()  # seen already: nothing more
    assert not [m for m in sent_messages() if m.attachments]


async def test_a_report_for_a_channel_discord_does_not_know_is_only_logged(discord_env, caplog):
    h = await discord_env([])
    rt = h.rt
    job_id = await rt.store.create_job("sleep", {"channel": "console"})
    await plant_gate(rt, job_id, planted_progress(job_id))
    caplog.set_level("INFO")
    await rt.night.poll()
    assert not [m for m in sent_messages() if m.attachments]
    assert f"night report #{job_id} with no Discord channel" in caplog.text
    assert f"**Night #{job_id} report**" in caplog.text  # the console's log has the text
