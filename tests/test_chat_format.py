"""model.chat_format = "auto": the format is read from the GGUF's own chat template, the
same way for the server's command line, the client's wire format and the night's rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import Config
from core.model import chat_format as cf
from core.model.chat_format import AUTO, GGUFHeaderError, choose, read_chat_template, resolve
from core.model.wire import FUNCTION_CALLING
from serving.kinds import LlamaCppPython

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "data/models/smollm2-135m-instruct-q8_0.gguf"
EMBEDDED_HF = ROOT / "data/models/smollm2-135m-instruct-hf"
LLAMA3 = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] }}<|eot_id|>{% endfor %}")


def write_gguf(path: Path, template: str | None, tokens: int = 3000) -> Path:
    """A header-only GGUF as llama.cpp's converter lays it out: the token list (strings)
    and other arrays come before the template, so reading it means skipping them."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(tokens)])
    writer.add_token_scores([0.0] * tokens)
    writer.add_token_types([1] * tokens)
    writer.add_array("test.nested", [[1, 2], [3]])
    if template is not None:
        writer.add_chat_template(template)
    writer.add_eos_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def config_for(gguf: Path, **model) -> Config:
    return Config.model_validate({"model": {"gguf": str(gguf), **model}})


@pytest.mark.skipif(not EMBEDDED.is_file(), reason="the embedded model is made by `make model`")
def test_the_embedded_gguf_template_is_read_from_its_header_and_is_chatml():
    template = read_chat_template(EMBEDDED)
    hf = (EMBEDDED_HF / "chat_template.jinja").read_text(encoding="utf-8")
    assert template.strip() == hf.strip()  # the converter copied it; we read that text
    choice = resolve(config_for(EMBEDDED))
    assert choice.name == FUNCTION_CALLING and choice.native
    assert "ChatML" in choice.reason


def test_the_default_config_is_auto():
    assert Config().model.chat_format == AUTO


def test_a_llama3_template_falls_back_to_function_calling_and_says_why(tmp_path):
    gguf = write_gguf(tmp_path / "llama3.gguf", LLAMA3)
    assert read_chat_template(gguf) == LLAMA3
    choice = resolve(config_for(gguf))
    assert choice.name == FUNCTION_CALLING and not choice.native
    assert "Llama 3" in choice.reason and "llama-server" in choice.reason


def test_a_gguf_without_template_assumes_chatml(tmp_path):
    gguf = write_gguf(tmp_path / "none.gguf", None)
    assert read_chat_template(gguf) is None
    assert "no chat template" in resolve(config_for(gguf)).reason


def test_a_qwen_style_template_with_its_own_tool_syntax_is_still_chatml():
    template = "{%- if tools %}<tool_call>{% endif %}<|im_start|>{{ m.role }}<|im_end|>"
    choice = choose(template)
    assert choice.name == FUNCTION_CALLING and choice.native
    assert "own tool syntax" in choice.reason


def test_a_named_format_is_used_as_configured_without_reading_the_gguf(tmp_path):
    choice = resolve(config_for(tmp_path / "absent.gguf", chat_format="llama-3"))
    assert (choice.name, choice.reason) == ("llama-3", "model.chat_format = 'llama-3' in the config")


def test_a_broken_header_fails_clearly(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little")
                    + (1).to_bytes(8, "little") + (2**40).to_bytes(8, "little"))
    with pytest.raises(GGUFHeaderError, match="out of bounds"):
        read_chat_template(bad)
    (tmp_path / "text.gguf").write_text("not a model, but long enough to be read")
    with pytest.raises(GGUFHeaderError, match="not a GGUF"):
        read_chat_template(tmp_path / "text.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GGUFHeaderError, match="too short"):
        read_chat_template(tmp_path / "empty.gguf")


def test_the_server_command_and_the_client_use_the_resolved_format(tmp_path):
    gguf = write_gguf(tmp_path / "m.gguf", LLAMA3)
    config = config_for(gguf)
    resolve(config)
    argv = LlamaCppPython().command(config, gguf, "127.0.0.1", 1)
    assert argv[argv.index("--chat_format") + 1] == FUNCTION_CALLING
    assert cf.chat_format_name(config) == FUNCTION_CALLING
    named = config_for(gguf, chat_format="chatml")
    argv = LlamaCppPython().command(named, gguf, "127.0.0.1", 1)
    assert argv[argv.index("--chat_format") + 1] == "chatml"


def test_the_trainer_renders_with_the_resolved_format():
    from trainer.train import Settings

    assert Settings().chat_format == FUNCTION_CALLING  # what auto resolves to for ChatML
    tokens = pytest.importorskip("trainer.tokens")
    with pytest.raises(ValueError, match="renders only"):
        tokens.render_row({"messages": [{"role": "user", "content": "hi"}], "tools": []},
                          None, chat_format="llama-3")
