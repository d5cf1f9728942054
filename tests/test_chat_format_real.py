"""model.chat_format = "auto" through the real parts: a tiny model whose GGUF carries a
Llama-3-style template (not ChatML) is converted by `python -m trainer setup`, the
doctor's line names the choice and why, and the real llama.cpp server serves a tool
request with the resolved format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bot.doctor import check_chat_format
from core.config import load_config
from core.model.chat_format import read_chat_template
from core.model.wire import FUNCTION_CALLING
from serving.client import LLM
from serving.supervisor import ServerSupervisor
from tests.test_other_architecture import tiny_qwen3

ROOT = Path(__file__).resolve().parents[1]
LLAMA3 = ("{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
          "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
          "{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


@pytest.mark.slow
async def test_a_non_chatml_gguf_is_served_with_the_fallback_and_the_doctor_says_why(
        tmp_path, free_port):
    hf = tiny_qwen3(tmp_path / "tiny-llama3-template")
    (hf / "chat_template.jinja").write_text(LLAMA3, encoding="utf-8")
    path = tmp_path / "config.toml"
    path.write_text(f'[paths]\ndata_dir = "data"\n[model]\nhf_dir = "{hf}"\n'
                    f"[server]\nport = {free_port}\n")
    done = subprocess.run([sys.executable, "-m", "trainer", "--config", str(path), "setup"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    config = load_config(path)
    assert config.model.chat_format == "auto"
    assert read_chat_template(config.served_gguf) == LLAMA3  # the converter kept it

    ok, line = await check_chat_format(config)
    assert ok and line.startswith(FUNCTION_CALLING + ": ")
    assert "Llama 3" in line and "weaker tool calls" in line

    supervisor = ServerSupervisor(config)
    await supervisor.start(watchdog=False)
    try:
        async with LLM(config, supervisor) as llm:
            reply = await llm.chat([{"role": "user", "content": "Add 2 and 3."}], tools=TOOLS,
                                   max_tokens=8, temperature=0)
        assert reply.prompt_tokens > 0  # the server rendered the request in that format
        started = supervisor.log_path.read_text(encoding="utf-8")
        assert f"--chat_format {FUNCTION_CALLING}" in started  # the command line it ran
    finally:
        await supervisor.stop()
