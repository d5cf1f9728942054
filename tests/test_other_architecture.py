"""A model of another architecture, end to end: the path is not SmolLM-only.

A tiny random Qwen3 (hidden size 64, SmolLM2's tokenizer) is configured the way
README's "Your own model" says, with ``model.hf_dir`` alone. Then, as a user would:
``python -m trainer setup`` converts it to q8_0 with the project's converter; the
doctor's pair check reads both files; the real llama.cpp server serves it; a
scripted day is stored; and a real night (judge, value, training, export, gate,
promotion) runs on it and its release goes live.

Why Qwen3 and not Qwen2: transformers 5 loads the tokenizer of any ``qwen2``
checkpoint as ``Qwen2Tokenizer``, which rebuilds the pre-tokenizer with Qwen's
regex; on SmolLM2's vocabulary that gives a pre-tokenizer llama.cpp's converter
does not know, so the conversion refuses it. A real Qwen2 checkpoint ships Qwen's
own tokenizer and converts; Qwen3 keeps the tokenizer it is given.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bot import admin
from bot.agent.tool_profiles import is_embedded, tool_names
from bot.model_pair import check_pair
from bot.runtime import Runtime
from core.config import load_config
from serving.client import LLM
from tests.scripted import ScriptedLLM
from tests.test_night_e2e import day_script, wait_for

ROOT = Path(__file__).resolve().parents[1]
HF_COPY = ROOT / "data/models/smollm2-135m-instruct-hf"


def tiny_qwen3(out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(HF_COPY)
    config = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         vocab_size=len(tok),
                         tie_word_embeddings=True, max_position_embeddings=8192,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.slow
async def test_a_tiny_qwen3_goes_through_setup_serving_and_a_night(tmp_path, free_port):
    hf = tiny_qwen3(tmp_path / "tiny-qwen3")
    probes = tmp_path / "probes.jsonl"
    probes.write_text(json.dumps({"prompt": "What is 2 + 3?", "expected": "5"}) + "\n")
    path = tmp_path / "config.toml"
    path.write_text(f"""
[paths]
data_dir = "data"
[model]
hf_dir = "{hf}"
[agent]
# The gate's answers stop at the reply limit: 84 of them (its open-chat prompts,
# before and after) at 128 tokens were most of this test's time; the path is under test.
max_reply_tokens = 24
[server]
port = {free_port}
[night]
auto_promote = true
gate_margin = -10.0
regression_margin = 10.0
probes_file = "probes.jsonl"
eval_percent = 0
window_messages = 6
understanding_fraction = 0.5
[train]
steps = 2
batch = 4
micro_batch = 2
lr = 2e-3
max_tokens = 512
""")
    done = subprocess.run([sys.executable, "-m", "trainer", "--config", str(path), "setup"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    config = load_config(path)
    served = config.served_gguf
    assert served == tmp_path / "data/models/tiny-qwen3-q8_0.gguf" and served.is_file()
    ok, detail = check_pair(served, hf)
    assert ok and detail.startswith("qwen3, 2 layers"), detail
    assert not is_embedded(config) and len(tool_names(config, ["a", "b"])) == 2  # every tool

    rt = await Runtime.start(config, llm=ScriptedLLM(day_script))
    real = LLM(config, rt.supervisor)
    try:
        reply = await real.chat([{"role": "user", "content": "Hello"}], max_tokens=8,
                                temperature=0)
        assert reply.completion_tokens > 0  # the real server generates with the Qwen3 GGUF
        for channel in ("general", "notes", "general"):
            await rt.turn(channel, f"Please remember: buy milk in #{channel}")
        text = await admin.sleep(rt.store, rt.night, rt.agent, "test", "general")
        assert text.startswith("Going to sleep: night job #1")
        job = await wait_for(rt, 1, ("live", "done", "failed"), 1200)
        assert job["state"] in ("live", "done"), job["error"]
        if job["state"] == "done":
            # The gate ran and refused the candidate: a random model's answers may turn
            # degenerate after training. The night's path is what is under test, so an
            # admin promotes the candidate, as in manual mode.
            assert job["progress"]["gate"]["passed"] is False
            assert (await admin.promote(rt.releases)).startswith("Now serving release #1")
        release = config.data_dir / "releases/night-0001"
        assert rt.supervisor.gguf == release / "model-q8_0.gguf"
        meta = json.loads((release / "release.json").read_text())
        assert "tiny-qwen3" in json.dumps(meta)
        ok, detail = check_pair(release / "model-q8_0.gguf", hf)
        assert ok, detail  # the release is still a Qwen3 with the same tokenizer
        after = await real.chat([{"role": "user", "content": "Hello"}], max_tokens=8,
                                temperature=0)
        assert after.completion_tokens > 0
    finally:
        await real.close()
        await rt.close()
