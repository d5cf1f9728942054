"""What one training run is told (``Settings``) and what it reports (``TrainResult``).

The hyperparameters a user sets live once, in ``core.config.learning.TrainConfig``
(``[train]`` in config.toml): ``Settings`` takes its defaults from there, and
``Settings.of`` builds a run's settings from a loaded config, so the night, a manual
``python -m trainer --config F train`` and the bench all train with the same values.
The fields below the config's are the run's own: where it starts, its budget, its bar."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from core.config import Config
from core.config.learning import TrainConfig
from trainer.tokens import FUNCTION_CALLING

_TRAIN = TrainConfig()  # the one place the defaults are written


@dataclass
class Settings:
    beta: float = _TRAIN.beta  # OAPL's KL strength
    echo_lambda: float = _TRAIN.echo_lambda  # weight of the observation cross-entropy
    imitation: float = _TRAIN.imitation  # weight of the demonstrations' cross-entropy
    # What the demonstrations' cross-entropy averages over (trainer.losses.imitation_loss).
    imitation_per: Literal["sequence", "token", "choice"] = _TRAIN.imitation_per
    # Imitate a reference's choice most of its attempts made too (trainer.examples.known_choices).
    imitate_known_choices: bool = _TRAIN.imitate_known_choices
    # The same for a passing attempt imitated by night.imitate_passing.
    imitate_known_passing_choices: bool = _TRAIN.imitate_known_passing_choices
    lr: float = _TRAIN.lr  # the peak rate: ``schedule`` and ``warmup_steps`` shape it
    schedule: str = _TRAIN.schedule
    warmup_steps: int = _TRAIN.warmup_steps
    batch: int = _TRAIN.batch  # sequences per optimizer step (gradient accumulation)
    micro_batch: int = _TRAIN.micro_batch  # the most sequences per forward/backward
    # The most tokens a forward/backward computes: a shared prompt prefix counts once, each
    # row's own tokens (padded to the longest) once per row. A longer sequence goes alone.
    micro_tokens: int = _TRAIN.micro_tokens
    epochs: int = _TRAIN.epochs
    steps: int | None = _TRAIN.steps or None  # optimizer steps; overrides epochs and min_steps
    min_steps: int = _TRAIN.min_steps  # the fewest optimizer steps when steps is unset
    max_epochs: int = _TRAIN.max_epochs  # passes min_steps may repeat the data to
    # Stopping on evidence (trainer.stopping): the share of mixed practice groups held out,
    # steps between checks, checks without a gain before the stop. 0 = train planned steps.
    stop_split: float = _TRAIN.stop_split
    stop_every: int = _TRAIN.stop_every
    stop_patience: int = _TRAIN.stop_patience
    max_tokens: int = 8192  # longer sequences are cut; the night passes the served context
    # The format the server used (core.model.chat_format): rows render as it rendered them.
    chat_format: str = FUNCTION_CALLING
    seed: int = 0
    chunk: int = 512  # positions per lm_head + log-softmax chunk
    lora_r: int = 16
    lora_alpha: int = 32
    grad_clip: float = 1.0
    gradient_checkpointing: bool = True
    # The decoder's matrix products under autocast in bfloat16, or plain float32
    # (trainer.policy; Settings.of resolves the config's "auto" by resolved_dtype, below).
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    offload_activations: bool = False  # keep checkpointed activations in host memory (GPU)
    progress: bool = True  # the tqdm bar
    # A PEFT adapter to continue instead of a fresh LoRA (adapter mode: the live night's).
    # pi_lag is then the model with it, computed for every sequence before the first update.
    # Its own rank and alpha hold (lora_r and lora_alpha are for a fresh LoRA).
    start_adapter: str | None = None
    # The seconds train() may take, loading included (the night's budget less its other
    # stages), and a tokens/s measured before on this machine: steps are cut to fit
    # (trainer.budget). None: no limit.
    time_budget_s: float | None = None
    expected_tokens_per_s: float | None = None

    @classmethod
    def of(cls, config: Config, base_dir: Path | str | None = None, **run: Any) -> Settings:
        """``config``'s ``[train]`` and ``[night].seed``, its served context as the longest
        sequence unless ``train.max_tokens`` is set, gradient checkpointing as
        ``train.gradient_checkpointing`` decides for the checkpoint at ``base_dir``, then
        the run's own fields (the chat format the server resolved, among them)."""
        t = config.train
        shared = {f.name: getattr(t, f.name) for f in fields(cls) if f.name in TrainConfig.model_fields}
        shared["steps"] = t.steps or None
        shared["max_tokens"] = t.max_tokens or config.model.context_tokens
        shared["gradient_checkpointing"] = (checkpointing(t.gradient_checkpointing, base_dir)
                                            if base_dir is not None else True)
        shared["compute_dtype"] = resolved_dtype(t.compute_dtype)
        return cls(**{**shared, "seed": config.night.seed, **run})


@dataclass
class TrainResult:
    out_dir: Path
    steps: int
    sequences: int  # training sequences (a row gives one per view)
    tokens: int  # tokens seen, summed over steps
    seconds: float
    history: list[dict] = field(default_factory=list)  # the on_step events
    model: Any = field(default=None, repr=False)  # the PeftModel, still in memory
    batch: int = 0  # sequences per step (``plan``: smaller than asked for a small night)
    planned_steps: int = 0  # before the time budget cut any
    budget_note: str = ""  # why fewer steps than planned ran, or ""
    tokens_per_s: float = 0.0  # tokens over the steps' own seconds (loading left out)
    groups: list[dict] = field(default_factory=list)  # trainer.margins, per mixed group
    stop_note: str = ""  # how stopping on evidence ended or rolled back the night, or ""
    stop_checks: list[dict] = field(default_factory=list)  # trainer.stopping, per check


def resolved_dtype(setting: str, cpu_flags: str | None = None) -> str:
    """"auto": bfloat16 where it is multiplied natively (2.8x float32's matrix rate on the
    2-core AVX512-BF16 machine, bench/train.py), float32 elsewhere, where bfloat16 would be
    emulated and slower. The device is a CUDA GPU when one is visible, as accelerate picks."""
    if setting != "auto":
        return setting
    import torch

    if torch.cuda.is_available():
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return "bfloat16" if native else "float32"
    if cpu_flags is None:
        try:
            cpu_flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpu_flags = ""
    native = {"avx512_bf16", "amx_bf16"} & set(cpu_flags.split())
    return "bfloat16" if native else "float32"


def checkpointing(setting: str, base_dir: Path) -> bool:
    """Gradient checkpointing recomputes each layer's activations in the backward pass
    (about a third more compute) to hold only one layer's at a time. A model under
    ~250M parameters (1 GB in float32) holds them all in a few hundred MB, so "auto"
    saves the time there and the memory above it."""
    if setting != "auto":
        return setting == "on"
    size = sum(f.stat().st_size for f in Path(base_dir).glob("*.safetensors"))
    return size >= 1 << 30
