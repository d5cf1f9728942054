"""The sections of config.toml that the night reads: ``[night]``, ``[train]`` and
``[practice]`` (the day-side sections are in ``core.config.sections``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from core.config.sections import _empty_is_none, _Section


class NightConfig(_Section):
    eval_percent: int = Field(
        10, ge=0, le=50, description="the share of episodes held out for evaluation (0..50)"
    )
    window_messages: int = Field(10, ge=2, le=50, description="messages per judged window (2..50)")
    max_extends: int = Field(
        2, ge=0, le=10, description="how often the judge may extend a window (0..10)"
    )
    extend_limit: int = Field(
        10, ge=1, le=50, description="most messages one extend may add on each side (1..50)"
    )
    judge_attempts: int = Field(
        3, ge=1, le=10, description="tries for a parseable judge reply before skipping (1..10)"
    )
    judge_max_tokens: int = Field(512, ge=64, description="a token count >= 64")
    value_neighbours: int = Field(
        8, ge=1, le=50, description="past sub-tasks shown to the value model (1..50)"
    )
    half_life_days: float = Field(
        14, gt=0, description="days after which a memory counts half (> 0)"
    )
    length_scale: float = Field(
        10, gt=0, description="turns that make a length advantage of 1 (> 0)"
    )
    length_weight: float = Field(
        0.5, ge=0, description="weight of the length advantage beside the reward's (>= 0)"
    )
    understanding_fraction: float = Field(
        0.3, ge=0, le=1, description="share of episodes given the understanding pass (0..1)"
    )
    judge_checked_fraction: float = Field(
        0.1, ge=0, le=1, description="share of channels whose episodes all have a check's reward "
                                     "that the judge still reads, for its agreement (0..1)"
    )
    judge_checked_max: int = Field(
        12, ge=0, description="the most such channels the judge reads in a night (>= 0)"
    )
    turn_penalty: float = Field(
        0.02, ge=0, description="advantage taken per extra assistant message in a turn (>= 0)"
    )
    stray_advantage: float = Field(
        -1.0, le=0, description="advantage on a stray end-of-turn's last token (<= 0)"
    )
    aborted_reward: float = Field(
        -1.0, ge=-1, le=0, description="reward of a turn stopped by the step limit (-1..0)"
    )
    seed: int = Field(0, description="an integer seed for the night's samples")
    imitate_passing: bool = Field(
        True, description="also imitate (train.imitation's likelihood) the attempts that "
                           "passed in a practice group whose attempts differ: best-of-G "
                           "fine-tuning beside OAPL"
    )
    anchor_demonstrated: bool = Field(
        True, description="true or false; in a practice group that all failed and got its "
                          "reference as an example, hold the first failed attempt where it "
                          "is (advantage 0): keeps the reference's format off other prompts, "
                          "and also holds that task's own wrong answer"
    )
    labels_per_person: int = Field(
        50, ge=0, description="the most episodes one person's labels decide in a night; past "
                              "it the judge decides (admins by user id and /label exempt)"
    )
    budget_s: float = Field(
        1200.0, ge=0, description="seconds a night may take; training takes fewer steps to fit "
                                  "(0 = no limit)"
    )
    auto_promote: bool = Field(
        False, description="true to serve a candidate that passes the gate at once"
    )
    gate_margin: float = Field(
        0.05, description="how much better, per held-out item (0..1), a candidate must score"
    )
    gate_min_items: int = Field(
        20, ge=1, description="held-out items the gate needs to decide (>= 1)"
    )
    gate_confidence: float = Field(
        0.9, gt=0, lt=1, description="the paired bootstrap interval's confidence (0..1)"
    )
    regression_margin: float = Field(
        0.5, ge=0, description="how much worse open chat may score before it is a regression"
    )
    eval_max: int = Field(32, ge=1, description="held-out prompts evaluated per night (>= 1)")
    probes_file: Path | None = Field(
        None, description="a JSONL file of {\"prompt\", \"expected\"} verifiable probes, or empty"
    )
    export_mode: Literal["merged", "adapter"] = Field(
        "merged", description="merged (q8_0 GGUF of the merged model) or adapter (--lora_path)"
    )
    single_gpu: bool = Field(
        False, description="true to stop serving while training (one GPU too small for both)"
    )
    report_channel: str = Field(
        "", description='the channel key for night reports; "" = the night\'s own channel'
    )

    _unset = field_validator("probes_file", mode="before")(_empty_is_none)


class TrainConfig(_Section):
    beta: float = Field(0.1, gt=0, description="OAPL's beta (> 0); 1e-3 collapsed a prototype")
    echo_lambda: float = Field(0.05, ge=0, description="the ECHO loss weight (>= 0)")
    imitation: float = Field(
        1.0, ge=0, description="the weight of the demonstrations' cross-entropy (>= 0)"
    )
    imitation_per: Literal["sequence", "token", "choice"] = Field(
        "sequence", description='what the demonstrations\' cross-entropy averages over: '
        '"sequence" (each demonstration weighs the same), "token" (each demonstrated token) '
        'or "choice" (each demonstration\'s choice under the tool list, and its words, apart)'
    )
    imitate_known_choices: bool = Field(
        False, description="also imitate a reference's choice under the tool list (words or "
        "which tool) where most attempts of its group made it too (trainer.examples)"
    )
    imitate_known_passing_choices: bool = Field(
        False, description="also imitate a passing attempt's choice under the tool list (words "
        "or which tool; night.imitate_passing) where most attempts of its group made it too"
    )
    lr: float = Field(1e-3, gt=0, le=1e-2, description="a peak learning rate in (0, 0.01]")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "cosine", description='the rate over the steps: "constant", "linear" or "cosine"'
    )
    warmup_steps: int = Field(
        2, ge=0, le=1000, description="optimizer steps rising to the peak rate (0..1000)"
    )
    batch: int = Field(32, ge=1, description="sequences per optimizer step (>= 1)")
    micro_batch: int = Field(16, ge=1, description="the most sequences per forward pass (>= 1)")
    micro_tokens: int = Field(
        4096, ge=64, description="the most tokens per forward pass, a shared prefix once (>= 64)"
    )
    epochs: int = Field(1, ge=1, le=20, description="passes over the night's data (1..20)")
    steps: int = Field(0, ge=0, description="optimizer steps; 0 = as many as epochs need")
    min_steps: int = Field(
        16, ge=1, description="the fewest optimizer steps when steps = 0 (>= 1)"
    )
    max_epochs: int = Field(
        2, ge=1, le=20,
        description="the most passes min_steps may repeat a night's data to (1..20); "
                    "a smaller night gets smaller batches",
    )
    max_tokens: int = Field(
        0, ge=0, description="the longest training sequence; 0 = model.context_tokens"
    )
    stop_split: float = Field(
        0.0, ge=0, le=0.5,
        description="the share of mixed practice groups held out to stop the night on "
                    "evidence (0..0.5; 0 = off, train the planned steps)",
    )
    stop_every: int = Field(
        4, ge=1, le=1000, description="optimizer steps between stopping checks (1..1000)"
    )
    stop_patience: int = Field(
        2, ge=1, le=100,
        description="checks in a row without a gain before the night stops (1..100)",
    )
    gradient_checkpointing: Literal["auto", "on", "off"] = Field(
        "auto", description='"auto", "on" or "off"; auto = on for checkpoints of 1 GB or more'
    )
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "float32", description='the matrix products\' dtype while training: "float32", '
        '"bfloat16" or "auto" (bfloat16 where the hardware multiplies it natively: a CUDA GPU '
        'with bf16, a CPU with AVX512-BF16 or AMX; else float32). The LoRA, the head, the '
        'log-probs and the merge stay float32'
    )

    @field_validator("max_tokens")
    @classmethod
    def _whole_rows(cls, value: int) -> int:
        if 0 < value < 128:
            raise ValueError("must be 0 (the served context) or at least 128")
        return value


class PracticeConfig(_Section):
    temperature: float = Field(
        0.8, ge=0, le=2,
        description="the sampling temperature of practice attempts, between 0 and 2 (the G "
                    "attempts of a task must differ to teach anything)",
    )
    samples: int = Field(4, ge=1, le=64, description="attempts per task by default (1..64)")
    mixed_samples: int = Field(
        0, ge=0, le=64,
        description="attempts in all for a task whose first attempts disagree (0..64; at "
                    "most `samples` turns it off)",
    )
    max_steps: int = Field(
        4, ge=1, le=100, description="model calls one /practice attempt may make (1..100)"
    )
    held_out_percent: int = Field(
        20, ge=0, le=90, description="the share of each set's tasks held out for the gate (0..90)"
    )
    check_timeout_s: float = Field(
        10, gt=0, le=300, description="seconds a regex or python check may run (0..300)"
    )
    demonstrate: bool = Field(
        True, description="true or false; when no attempt of a task passes, its reference "
                          "answer (an exact check's text, or the task's \"reference\") "
                          "joins the attempts as an example"
    )
