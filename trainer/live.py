"""What serves now: the live release's model files, the night's base and, in adapter
mode, the adapter it continues."""

from __future__ import annotations

from pathlib import Path

from core.config import Config
from core.storage.store import Store


async def live_model(config: Config, store: Store) -> tuple[Path, Path | None, Path, int | None]:
    """What serves now, the night's base: (GGUF, LoRA GGUF or None, the HF checkpoint it
    came from, its release id or None for the base model). The bot serves what is live."""
    for release in await store.releases():
        if release["state"] == "live":
            meta = release["meta"]
            lora = Path(meta["lora"]) if meta.get("lora") else None
            # The HF checkpoint of what serves: a merged release's own; an adapter release's
            # base (which may be an earlier merged release, not the configured base).
            hf = meta.get("merged_dir") or (meta.get("hf_base") if lora else None)
            return Path(meta["gguf"]), lora, Path(hf or config.base_hf_dir), release["id"]
    return config.served_gguf, None, config.base_hf_dir, None


def live_adapter(config: Config, live_lora: Path | None) -> Path | None:
    """In adapter mode, the live release's PEFT adapter (beside its LoRA GGUF), which the
    night continues: night N+1 is trained on top of N. None otherwise (a fresh LoRA on the
    live merged checkpoint, or on the base)."""
    if config.night.export_mode != "adapter" or live_lora is None:
        return None
    folder = live_lora.parent
    return folder if (folder / "adapter_model.safetensors").is_file() else None
