"""Which tools the agent is offered: a profile, not one global list.

``agent.tools`` is one of:

- ``"auto"`` (the default): the embedded 135M model gets ``CORE_TOOLS``, a
  small set; any other model (``model.gguf`` set to another file) gets every
  tool. Every schema is prompt text the model re-reads on every call (40
  schemas are ~3,300 tokens), and a small model chooses worse from a long
  list: bench/tools_choice.py measured it (figures in README.md, "Tools").
- ``"all"`` (or ``[]``, the old spelling): every tool, whatever the model;
- a list of names: exactly those.
"""

from __future__ import annotations

from core.config import Config, ConfigError

# Chosen with bench/tools_choice.py (README, "Tools"): on 11 fixed prompts the embedded
# model served 6 right with these 3 tools, 3 with 8 and 5 with all 42 (the choice made on
# whole options, core.model.choice). With 8 it mostly calls read_file, whatever the request.
CORE_TOOLS = ("read_file", "write_file", "list_dir")


def is_embedded(config: Config) -> bool:
    """True when the served model is the embedded one (no other model configured)."""
    return config.served_gguf.name == config.embedded_gguf.name


def tool_names(config: Config, available: list[str]) -> list[str]:
    """The names to offer; raises ConfigError for unknown names."""
    wanted = config.agent.tools
    if wanted == "auto":
        wanted = list(CORE_TOOLS) if is_embedded(config) else []
        if wanted and config.agent.clear_scratch_after_turn:
            wanted.append("clear_scratch")  # the end of a turn calls it (undoable)
        if wanted and config.swarms.teams:
            wanted += ["board_post", "board_read"]  # a swarm's members talk through its board
    if wanted in ("all", []):
        return list(available)
    unknown = sorted(set(wanted) - set(available))
    if unknown:
        raise ConfigError(f"agent.tools = {unknown} names unknown tools. Fix: use names from "
                          f"{', '.join(available)}, or \"auto\" or \"all\".")
    return list(dict.fromkeys(wanted))
