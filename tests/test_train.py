"""The LoRA loop on a tiny random Llama with the real SmolLM2 tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer import plan as P
from trainer import train as T
from trainer import train_cli
from trainer.losses import echo_loss, imitation_loss, oapl_loss

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


def _rows() -> list[dict]:
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    episode = {"kind": "episode", "episode_id": 1, "split": "train", "tools": TOOLS, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add two."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "name": "add", "content": "4"},
        {"role": "assistant", "content": "It is 4."}],
        "advantages": [None, None, 0.5, None, -0.5],
        "token_overrides": [{"message": 4, "token": -1, "advantage": -1.0}], "labels": []}
    chat = {"kind": "episode", "episode_id": 2, "split": "train", "tools": [], "messages": [
        {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Hi again."}],
        "advantages": [None, 0.8, None, -0.2], "token_overrides": [], "labels": []}
    held_out = {**chat, "episode_id": 3, "split": "eval"}
    return [episode, chat, held_out]


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    return None


@pytest.fixture(scope="module")
def base_dir(tiny_base) -> Path:
    return tiny_base


@pytest.fixture(scope="module")
def trained(base_dir, tmp_path_factory):
    """20 steps on one fixed batch (all sequences every step).

    A tiny random model's logits span about one nat, so beta=1 keeps the OAPL
    targets (A / beta nats) within reach, and a higher lr gets there in 20 steps.
    """
    out = tmp_path_factory.mktemp("adapter")
    events = []
    settings = T.Settings(steps=20, batch=64, micro_batch=2, lr=2e-3, beta=1.0, progress=False)
    return T.train(_rows(), base_dir, out, settings, on_step=events.append), events


def _tokenizer(base_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_dir))


def _lora_nonzero(model) -> None:
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)


def test_chunked_logprobs_equal_full_logits_and_so_do_gradients(base_dir):
    model = T.load_model(base_dir, T.Settings())
    _lora_nonzero(model)
    ids = torch.randint(0, 49152, (2, 37))
    policy = T.Policy(model, chunk=7)  # 72 positions: 10 full chunks and a partial one
    ours = policy(ids)  # (2, 37)
    ours[:, 1:].sum().backward()
    ours_grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    logits = model(input_ids=ids).logits  # (2, 37, V): the reference builds it whole
    full = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    full.sum().backward()
    full_grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert torch.equal(ours[:, 0], torch.zeros(2))
    assert torch.allclose(ours[:, 1:], full, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(ours_grads, full_grads))


def test_pi_lag_is_the_adapter_disabled_model_which_is_the_base(base_dir):
    from transformers import AutoModelForCausalLM

    settings = T.Settings(micro_batch=2)
    tokenizer = _tokenizer(base_dir)
    examples = T.build_examples(_rows(), tokenizer, settings)
    model = T.load_model(base_dir, settings)
    policy = T.Policy(model, chunk=16)
    T.fill_lag(model, policy, examples, settings, tokenizer.pad_token_id, torch.device("cpu"))
    _lora_nonzero(model)  # as if trained
    base = AutoModelForCausalLM.from_pretrained(str(base_dir))
    for e in examples:
        ids = e.ids[None]
        with torch.no_grad():
            ref = base(input_ids=ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
            adapted = policy(ids)[0, 1:]
        read = ((e.msg >= 0) | ~torch.isnan(e.tok_adv))[1:]  # what OAPL reads of pi_lag
        assert read.any() and torch.allclose(e.lag[1:][read], ref[read], atol=1e-5)
        assert not torch.allclose(adapted, ref, atol=1e-3)


def test_training_changes_the_lora_and_leaves_the_base_untouched(trained, base_dir):
    from safetensors.torch import load_file

    result, _ = trained
    base = load_file(str(base_dir / "model.safetensors"))
    lora = {n: p for n, p in result.model.named_parameters() if "lora_" in n}
    assert len(lora) == 2 * 7 * 2  # A and B on 7 projections in 2 layers
    assert all(p.abs().sum() > 0 for n, p in lora.items() if "lora_B" in n)  # B starts at zero
    checked = 0
    for name, p in result.model.named_parameters():
        if "lora_" in name:
            continue
        assert not p.requires_grad
        key = name.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(p.detach(), base[key]), name
        checked += 1
    assert checked >= 2 * 9 + 2
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in result.out_dir.iterdir()}
    config = json.loads((result.out_dir / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 32
    assert set(config["target_modules"]) == set(T.LORA_TARGETS)


def test_oapl_loss_falls_on_a_fixed_batch(trained):
    result, events = trained
    assert [e["step"] for e in events] == list(range(1, 21))
    assert result.sequences == 3  # the eval row is left out; the tools row gives two views
    first, last = events[0], events[-1]
    assert first["oapl"] == pytest.approx((0.25 + 0.25 + 1.0 + 0.64 + 0.04) / 5, rel=1e-4)  # A^2 at step 0
    assert first["logratio_pos"] == 0 and first["logratio_neg"] == 0
    assert last["oapl"] < 0.1 * first["oapl"]
    assert last["logratio_pos"] > 0 > last["logratio_neg"]
    assert {"echo", "total", "tokens_per_s", "grad_norm"} <= set(last)
    assert last["imitation"] is None  # no demonstration in the batch: nothing to report


class _GradRecorder:
    def __init__(self, params):
        self.params, self.grads = params, None

    def step(self):
        self.grads = [p.grad.clone() for p in self.params]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


@pytest.mark.parametrize("per", ["sequence", "token", "choice"])
def test_accumulated_gradient_is_the_gradient_of_the_batch_means(base_dir, per):
    """Split into micro-batches or not, a step's gradient is that of the batch means, the
    imitation's per demonstration, per demonstrated token or per choice-and-words part
    (train.imitation_per)."""
    from accelerate import Accelerator

    tokenizer = _tokenizer(base_dir)
    grads = {}
    # A demonstrated call and a demonstrated answer in words: imitation is accumulated too.
    demos = [{**_rows()[0], "episode_id": 7, "advantages": [None] * 5, "token_overrides": [],
              "imitate": [2, 4]},
             {**_rows()[1], "episode_id": 8, "advantages": [None] * 4, "imitate": [3]}]
    for micro in (1, 3):
        settings = T.Settings(micro_batch=micro, grad_clip=1e9, imitation_per=per)
        examples = T.build_examples(_rows() + demos, tokenizer, settings)
        assert sum(bool(e.demo.any()) for e in examples) >= 2
        model = T.load_model(base_dir, settings)
        _lora_nonzero(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        recorder = _GradRecorder(trainable)
        policy = T.Policy(model, chunk=64)
        ctx = {"accelerator": Accelerator(cpu=True), "settings": settings, "policy": policy,
               "model": model, "optimizer": recorder, "trainable": trainable,
               "pad_id": tokenizer.pad_token_id}
        T._train_step(ctx, examples)
        grads[micro] = recorder.grads
    # The reference: one forward over the whole batch, plain batch means.
    batch = T.collate(examples, tokenizer.pad_token_id)
    logp = policy(batch["ids"])
    oapl, _ = oapl_loss(logp, batch["lag"], batch["msg"], batch["adv"], token_adv=batch["tok_adv"])
    (oapl + echo_loss(logp, batch["obs"]) + imitation_loss(logp, batch["demo"], per=per,
                                                             head=batch["head"])
     ).backward()
    for a, b, ref in zip(grads[1], grads[3], trainable):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
        assert torch.allclose(a, ref.grad, atol=1e-6, rtol=1e-4)


def test_cli_trains_from_jsonl_and_writes_the_adapter(base_dir, tmp_path, capsys):
    data = tmp_path / "night.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    out = tmp_path / "adapter"
    assert train_cli.main(["--data", str(data), "--base", str(base_dir), "--out", str(out),
                   "--steps", "1", "--micro-batch", "4", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 1 and summary["sequences"] == 3
    assert (out / "adapter_model.safetensors").is_file()


def test_python_m_trainer_train_trains_with_the_configs_lr_and_batch(base_dir, tmp_path, capsys):
    """A manual retrain ran with trainer.train's own defaults while the night used [train]."""
    from trainer.__main__ import main as trainer_main

    data = tmp_path / "night.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    config = tmp_path / "config.toml"
    data_dir = tmp_path / "data"
    config.write_text(f'[paths]\ndata_dir = "{data_dir}"\n'
                      "[train]\nlr = 0.005\nbatch = 2\nsteps = 1\nschedule = \"constant\"\n"
                      "warmup_steps = 0\nmicro_batch = 4\n")
    assert trainer_main(["--config", str(config), "train", "--data", str(data), "--base",
                         str(base_dir), "--out", str(tmp_path / "adapter"), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["batch"] == 2 and summary["last"]["sequences"] == 2
    assert summary["lr"] == 0.005 and summary["last"]["lr"] == pytest.approx(0.005)


def test_rows_without_anything_to_learn_are_refused(base_dir, tmp_path):
    row = {"split": "eval", "tools": [], "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValueError, match="no training sequence"):
        T.train([row], base_dir, tmp_path, T.Settings(progress=False))


def test_batches_cover_every_sequence_once_per_epoch_and_feed_every_process():
    import itertools

    for n, batch, processes in ((10, 4, 1), (10, 4, 3), (3, 64, 1)):
        per_epoch = P.batches_per_epoch(n, batch, processes)
        batches = [b for b, _ in itertools.islice(P.batches(n, T.Settings(batch=batch), processes),
                                                  2 * per_epoch)]
        for epoch in (batches[:per_epoch], batches[per_epoch:]):
            assert sorted(i for b in epoch for i in b) == list(range(n))
            assert all(processes <= len(b) for b in epoch)
        assert batches[:per_epoch] != batches[per_epoch:] or n < 4  # reshuffled each epoch


def test_the_remainder_batch_is_weighted_by_its_size():
    import itertools

    def epoch(n, batch, processes=1):
        return [(len(b), w) for b, w in itertools.islice(
            P.batches(n, T.Settings(batch=batch), processes), P.batches_per_epoch(n, batch, processes))]

    assert epoch(70, 64) == [(64, 1.0), (6, 6 / 64)]
    assert epoch(20, 64) == [(20, 1.0)]  # a night smaller than a batch: no remainder
    assert epoch(128, 64) == [(64, 1.0), (64, 1.0)]
    assert epoch(65, 64, processes=2) == [(65, 1.0)]  # too small to split: joins the batch


def test_a_night_takes_at_least_min_steps_unless_steps_is_set():
    assert P.planned_steps(3, T.Settings()) == 16  # one batch a night would be 1 step
    assert P.planned_steps(3, T.Settings(min_steps=5, epochs=2)) == 5
    assert P.planned_steps(640, T.Settings(batch=64, epochs=2)) == 20  # 2 epochs of 10 batches
    assert P.planned_steps(3, T.Settings(steps=2)) == 2  # an explicit count wins


def test_a_small_night_gets_smaller_batches_not_more_than_max_epochs_passes():
    """Repeated to min_steps x batch, a small night's sequences were seen about six times
    each; its batches shrink instead, and only with one sequence a batch are there fewer steps."""
    big = T.Settings(batch=32)
    assert T.plan(306, big) == (16, 32)  # 512 sequences: 1.7 passes, as asked
    assert T.plan(640, big) == (20, 32)  # one epoch is more than min_steps
    steps, batch = T.plan(51, big)
    assert (steps, batch) == (16, 6) and steps * batch <= 2 * 51
    assert T.plan(3, big) == (6, 1)  # two passes of one sequence a step
    assert T.plan(51, T.Settings(batch=32, max_epochs=20)) == (16, 32)  # the old repetition
    assert T.plan(51, T.Settings(batch=32, steps=4)) == (4, 32)  # an explicit count wins
    assert T.plan(240, T.Settings(batch=32, epochs=2)) == (16, 32)  # epochs cover min_steps


def test_a_weighted_step_scales_the_gradient_and_train_uses_min_steps(base_dir, tmp_path):
    from accelerate import Accelerator

    tokenizer = _tokenizer(base_dir)
    grads = {}
    for weight in (1.0, 0.25):
        settings = T.Settings(micro_batch=2, grad_clip=1e9)
        examples = T.build_examples(_rows(), tokenizer, settings)
        model = T.load_model(base_dir, settings)
        _lora_nonzero(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        recorder = _GradRecorder(trainable)
        ctx = {"accelerator": Accelerator(cpu=True), "settings": settings,
               "policy": T.Policy(model, chunk=64), "model": model, "optimizer": recorder,
               "trainable": trainable, "pad_id": tokenizer.pad_token_id}
        event = T._train_step(ctx, examples, weight)
        grads[weight] = recorder.grads
        assert event["weight"] == weight
    assert all(torch.allclose(a * 0.25, b, atol=1e-7, rtol=1e-5) for a, b in zip(grads[1.0], grads[0.25]))
    events = []
    result = T.train(_rows(), base_dir, tmp_path, T.Settings(min_steps=3, progress=False),
                     on_step=events.append)
    # Three sequences, min_steps 3: within two passes, batches of 2 (the remainder weighs 1/2).
    assert result.steps == 3 and result.batch == 2
    assert [(e["sequences"], e["weight"]) for e in events] == [(2, 1.0), (1, 0.5), (2, 1.0)]


def test_gradient_checkpointing_auto_is_on_for_big_checkpoints_only(tmp_path):
    from trainer.settings import checkpointing

    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    assert not checkpointing("auto", tmp_path) and checkpointing("on", tmp_path)
    with open(tmp_path / "model.safetensors", "r+b") as f:  # a sparse 1 GiB file
        f.truncate(1 << 30)
    assert checkpointing("auto", tmp_path) and not checkpointing("off", tmp_path)


def test_a_missing_base_checkpoint_is_a_clear_error_not_a_hub_lookup(tmp_path, capsys):
    """transformers took the missing folder for a hub repo id and said only that (issue 11)."""
    with pytest.raises(FileNotFoundError, match="the base checkpoint .*/nothing is missing"):
        T.train(_rows(), tmp_path / "nothing", tmp_path / "out")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _rows()))
    with pytest.raises(SystemExit) as caught:
        train_cli.main(["--data", str(data), "--base", str(tmp_path / "nothing"), "--out", str(tmp_path)])
    assert caught.value.code == 2 and "nothing is missing" in capsys.readouterr().err


def test_a_demonstration_is_imitated_its_likelihood_rises_and_it_is_no_oapl_term(base_dir, tmp_path):
    """A reference answer the model would never write: OAPL could move it A / beta nats at
    most; the imitation loss raises its log-likelihood with no such ceiling."""
    demo = {"kind": "episode", "episode_id": 9, "split": "train", "tools": [], "messages": [
        {"role": "user", "content": "Reply with the word cloud in brackets."},
        {"role": "assistant", "content": "[CLOUD]"}],
        "advantages": [None, None], "imitate": [1], "token_overrides": [], "labels": []}
    tokenizer = _tokenizer(base_dir)
    settings = T.Settings(steps=15, lr=5e-3, micro_batch=2, progress=False)
    (example,) = T.build_examples([demo], tokenizer, settings)
    assert example.terms == 0 and int(example.demo.sum()) >= 3  # "[CLOUD]<|im_end|>" tokens
    events = []
    result = T.train([demo], base_dir, tmp_path, settings, on_step=events.append)
    policy = T.Policy(result.model, chunk=64)
    with torch.no_grad():
        after = policy(example.ids[None])[0][example.demo].sum()
        with result.model.disable_adapter():
            before = policy(example.ids[None])[0][example.demo].sum()
    assert after > before + 5.0  # nats: far past what the message's tokens started at
    assert events[0]["imitation"] > 0 and events[-1]["imitation"] < events[0]["imitation"] - 1.0
    assert events[-1]["oapl"] == 0.0
    assert T.Settings(imitation=0.0).imitation == 0.0


def test_a_continued_adapter_is_pi_lag_and_the_next_night_starts_from_it(trained, base_dir, tmp_path):
    """Adapter mode chains nights: night 2 loads night 1's adapter, its pi_lag is that
    model (so the first step's log-ratios are 0), and its update starts where 1 ended."""
    first, _ = trained
    tokenizer = _tokenizer(base_dir)
    events = []
    settings = T.Settings(steps=2, lr=1e-3, beta=1.0, progress=False,
                          start_adapter=str(first.out_dir))
    second = T.train(_rows(), base_dir, tmp_path, settings, on_step=events.append)
    assert events[0]["logratio_pos"] == pytest.approx(0, abs=1e-4)
    assert events[0]["oapl"] == pytest.approx((0.25 + 0.25 + 1.0 + 0.64 + 0.04) / 5, rel=1e-3)
    one = dict(first.model.named_parameters())
    moved = [float((p - one[n]).abs().max()) for n, p in second.model.named_parameters()
             if "lora_B" in n]
    assert 0 < max(moved) < 0.1 * max(float(one[n].abs().max()) for n in one if "lora_B" in n)
    fresh = T.load_model(base_dir, T.Settings())
    examples = T.build_examples(_rows(), tokenizer, T.Settings())
    T.fill_lag(fresh, T.Policy(fresh, chunk=64), examples, T.Settings(), tokenizer.pad_token_id,
               torch.device("cpu"))
    chained = T.build_examples(_rows(), tokenizer, T.Settings())
    loaded = T.load_model(base_dir, settings)
    T.fill_lag(loaded, T.Policy(loaded, chunk=64), chained, settings, tokenizer.pad_token_id,
               torch.device("cpu"))
    assert not torch.allclose(examples[0].lag, chained[0].lag)  # night 1's model, not the base


def test_a_shared_prompt_prefix_is_computed_once_with_the_same_logprobs_and_gradients(base_dir):
    model = T.load_model(base_dir, T.Settings(gradient_checkpointing=False))  # else no cache
    assert not model.get_base_model().is_activation_checkpointing
    _lora_nonzero(model)
    policy = T.Policy(model, chunk=16)
    torch.manual_seed(3)
    prefix = torch.randint(0, 1000, (1, 30))
    ids = torch.cat([prefix.expand(3, 30), torch.randint(0, 1000, (3, 12))], dim=1)
    trainable = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(3, 42)
    full = policy(ids)
    full_grads = torch.autograd.grad((full * weights).sum(), trainable)
    shared = policy(ids, shared=30)
    shared_grads = torch.autograd.grad((shared * weights).sum(), trainable)
    assert torch.allclose(full, shared, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(full_grads, shared_grads))
    assert shared[:, 0].eq(0).all()


def test_the_head_applied_only_where_a_loss_reads_gives_the_same_logprobs_and_gradients(base_dir):
    model = T.load_model(base_dir, T.Settings(gradient_checkpointing=False))
    _lora_nonzero(model)
    policy = T.Policy(model, chunk=5)
    torch.manual_seed(4)
    prefix = torch.randint(0, 1000, (1, 20))
    ids = torch.cat([prefix.expand(3, 20), torch.randint(0, 1000, (3, 10))], dim=1)  # (3, 30)
    need = torch.rand(3, 30) < 0.3
    need[0, 5] = True  # one prefix position read by one row only: every row gets its value
    trainable = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(3, 30) * need
    full = policy(ids)
    full_grads = torch.autograd.grad((full * weights).sum(), trainable)
    for shared in (0, 20):
        picked = policy(ids, shared=shared, need=need)
        grads = torch.autograd.grad((picked * weights).sum(), trainable)
        read = need.clone()
        read[:, 0] = False
        assert torch.allclose(picked[read], full[read], atol=1e-5)
        outside = ~read
        if shared:  # a prefix position any row reads is computed for all
            outside[:, :20] &= ~read[:, :20].any(dim=0)
        assert picked[outside].eq(0).all()
        assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(full_grads, grads))


def test_pi_lag_is_not_computed_for_a_sequence_without_an_oapl_term(base_dir):
    settings = T.Settings(max_tokens=512, gradient_checkpointing=False)
    model = T.load_model(base_dir, settings)
    examples = T.build_examples(_rows(), _tokenizer(base_dir), settings)
    observed = T.Example(examples[0].ids, torch.full_like(examples[0].ids, -1), torch.zeros(0),
                         torch.full((len(examples[0].ids),), float("nan")),
                         torch.ones(len(examples[0].ids), dtype=torch.bool), 0)
    calls = []
    policy = T.Policy(model, chunk=16)
    counted = lambda ids, *args: calls.append(ids.shape[0]) or policy(ids, *args)  # noqa: E731
    T.fill_lag(model, counted, [observed], settings, 0, torch.device("cpu"))
    assert calls == [] and observed.lag.eq(0).all()
    T.fill_lag(model, counted, [*examples, observed], settings, 0, torch.device("cpu"))
    assert sum(calls) == len(examples)  # the observed sequence was not computed again


def test_the_losses_read_no_position_the_head_skipped(base_dir, monkeypatch):
    """The losses on log-probs computed only where ``needed`` says equal the losses on every
    position's log-prob: no loss reads a skipped one (a system prompt, padding)."""
    settings = T.Settings(max_tokens=512, gradient_checkpointing=False)
    model = T.load_model(base_dir, settings)
    _lora_nonzero(model)
    policy = T.Policy(model, chunk=16)
    examples = T.build_examples(_rows(), _tokenizer(base_dir), settings)
    for e in examples:
        e.lag = torch.randn(len(e.ids)) * 0.1 - 3.0
    for e in examples[:1]:
        e.demo[-3:] = True  # a demonstration too
    need = T.needed(T.collate(examples, 0))
    assert 0 < int(need.sum()) < need.numel()  # something is skipped
    picked = T.micro_losses(policy, examples, settings, 0, torch.device("cpu"))
    monkeypatch.setattr(T, "needed", lambda batch: torch.ones_like(batch["ids"], dtype=torch.bool))
    every = T.micro_losses(policy, examples, settings, 0, torch.device("cpu"))
    for a, b in zip(picked[:3], every[:3]):
        assert float(a.detach()) != 0.0 and torch.allclose(a, b, atol=1e-6)


def test_micro_batches_group_rows_by_their_shared_prefix_within_the_token_budget():
    def example(tokens):
        ids = torch.tensor(tokens)
        return T.Example(ids, torch.full_like(ids, -1), torch.zeros(0),
                         torch.full((len(ids),), float("nan")), torch.zeros(len(ids), dtype=torch.bool), 0)

    a = [example([1] * 100 + [k, 7, 7]) for k in range(5)]  # one 100-token prompt
    b = [example([2] * 50 + [k]) for k in range(3)]
    micros = T._micro_batches([a[0], b[0], a[1], b[1], a[2], a[3], a[4], b[2]],
                              T.Settings(micro_batch=4, micro_tokens=120))
    assert sorted(len(m) for m in micros) == [1, 3, 4]  # 5 a-rows: 100 + 4 * 3 tokens fit
    assert all(len({int(e.ids[0]) for e in m}) == 1 for m in micros)
    assert T.shared_prefix(micros[0]) >= 50
    assert T.shared_prefix([a[0]]) == 0 and T.shared_prefix([a[0], a[0]]) == 102  # one own token
    alone = T._micro_batches([example([3] * 500), example([3] * 499 + [4])],
                             T.Settings(micro_tokens=400))
    assert [len(m) for m in alone] == [1, 1]  # 499 shared + 2 own tokens > 400: each alone


def test_without_checkpointing_the_first_step_still_starts_at_pi_lag(base_dir, tmp_path):
    rows = _rows()
    again = {**rows[1], "episode_id": 4, "messages": [*rows[1]["messages"][:3],
                                                     {"role": "assistant", "content": "Hey."}]}
    events = []
    settings = T.Settings(steps=1, beta=1.0, gradient_checkpointing=False, progress=False)
    micros = T._micro_batches(T.build_examples([*rows, again], _tokenizer(base_dir), settings),
                              settings)
    assert max(T.shared_prefix(m) for m in micros) > 5  # the shared path is taken
    T.train([*rows, again], base_dir, tmp_path, settings, on_step=events.append)
    assert events[0]["oapl"] == pytest.approx((0.25 + 0.25 + 1.0 + 0.64 + 0.04 + 0.64 + 0.04) / 7,
                                              rel=1e-4)


def test_without_sharing_a_micro_batch_counts_every_row_whole(base_dir):
    def example(n):
        ids = torch.tensor([5] * 2000 + list(range(n)))
        return T.Example(ids, torch.full_like(ids, -1), torch.zeros(0),
                         torch.full((len(ids),), float("nan")), torch.zeros(len(ids), dtype=torch.bool), 0)

    rows = [example(100) for _ in range(4)]
    settings = T.Settings(micro_tokens=4096)
    assert [len(m) for m in T._micro_batches(rows, settings, shares=True)] == [4]  # 2000 + 4 * 100
    assert [len(m) for m in T._micro_batches(rows, settings, shares=False)] == [1, 1, 1, 1]
    checkpointed = T.load_model(base_dir, T.Settings(gradient_checkpointing=True))
    assert not T.sharing(checkpointed) and not T.Policy(checkpointed, 16).shares
    assert T.sharing(T.load_model(base_dir, T.Settings(gradient_checkpointing=False)))


def test_each_step_trains_at_the_scheduled_rate(base_dir, tmp_path, monkeypatch):
    # Adam's first update moves every LoRA weight with a gradient by about the rate itself
    # (m / sqrt(v) = sign(g)); a fresh LoRA's B starts at zero, so after the first step its
    # largest entry is the rate the optimizer was given.
    load, models = T.load_model, []
    monkeypatch.setattr(T, "load_model", lambda *a: models.append(load(*a)) or models[-1])

    def largest_b() -> float:
        return max(float(p.detach().abs().max()) for name, p in models[-1].named_parameters()
                   if "lora_B" in name)

    for schedule, warmup, first in (("constant", 0, 1.0), ("cosine", 1, 0.5)):
        events, after_first = [], []
        settings = T.Settings(steps=4, lr=1e-3, schedule=schedule, warmup_steps=warmup,
                              progress=False)
        T.train(_rows(), base_dir, tmp_path / schedule, settings,
                on_step=lambda e: (events.append(e), after_first.append(largest_b())))
        # What the optimizer was given: the peak, or 0.5, 1, 0.55, 0.1 of it.
        expected = [1.0] * 4 if schedule == "constant" else [0.5, 1.0, 0.55, 0.1]
        assert [e["lr"] for e in events] == pytest.approx([1e-3 * f for f in expected])
        assert after_first[0] == pytest.approx(first * 1e-3, rel=1e-2)


def test_bfloat16_compute_keeps_float32_logprobs_close_and_gradients_on_the_lora(base_dir):
    """Under bfloat16 autocast the decoder's products round, the head does not: log-probs
    stay within a few hundredths of a nat of float32's, with or without a shared prompt,
    and the gradient still reaches the (float32) LoRA, pointing the same way."""
    model = T.load_model(base_dir, T.Settings(gradient_checkpointing=False))
    _lora_nonzero(model)
    torch.manual_seed(4)
    prefix = torch.randint(0, 1000, (1, 30))
    ids = torch.cat([prefix.expand(3, 30), torch.randint(0, 1000, (3, 12))], dim=1)
    trainable = [p for p in model.parameters() if p.requires_grad]
    exact, fast = T.Policy(model, chunk=16), T.Policy(model, chunk=16, compute_dtype="bfloat16")
    heads = []
    from trainer.policy import TargetLogProb

    apply = TargetLogProb.apply

    def head(hidden, *rest):  # what reaches the head: float32, outside any autocast
        heads.append((hidden.dtype, torch.is_autocast_enabled("cpu")))
        return apply(hidden, *rest)

    TargetLogProb.apply = head
    try:
        runs = [(exact(ids, shared=shared), fast(ids, shared=shared)) for shared in (0, 30)]
    finally:
        TargetLogProb.apply = apply
    assert heads and set(heads) == {(torch.float32, False)}
    for shared, (want, got) in zip((0, 30), runs):
        assert not torch.equal(got, want)  # it did round
        assert (got - want).abs().max() < 0.05
        g_want = torch.cat([g.flatten() for g in torch.autograd.grad(want.sum(), trainable)])
        g_got = torch.cat([g.flatten() for g in torch.autograd.grad(got.sum(), trainable)])
        assert all(p.dtype == torch.float32 for p in trainable)
        assert torch.nn.functional.cosine_similarity(g_want, g_got, dim=0) > 0.99


def test_a_bfloat16_night_imitates_as_a_float32_one_does(base_dir, tmp_path):
    demo = {"kind": "episode", "episode_id": 9, "split": "train", "tools": [], "messages": [
        {"role": "user", "content": "Reply with the word cloud in brackets."},
        {"role": "assistant", "content": "[CLOUD]"}],
        "advantages": [None, None], "imitate": [1], "token_overrides": [], "labels": []}
    losses = {}
    for dtype in ("float32", "bfloat16"):
        settings = T.Settings(steps=15, lr=5e-3, micro_batch=2, progress=False,
                              compute_dtype=dtype)
        events = []
        T.train([demo], base_dir, tmp_path / dtype, settings, on_step=events.append)
        losses[dtype] = [e["imitation"] for e in events]
    assert losses["bfloat16"][-1] < losses["bfloat16"][0] - 1.0
    assert abs(losses["bfloat16"][-1] - losses["float32"][-1]) < 0.1 * losses["float32"][0]


def test_compute_dtype_auto_is_bfloat16_only_where_it_is_native(monkeypatch, tmp_path):
    from core.config import Config
    from trainer import settings as S
    from trainer.settings import resolved_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: asked.append(including_emulation))
    assert resolved_dtype("auto") == "float32" and asked == [False]  # emulated is not native
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = Config()
    config.train.compute_dtype = "auto"
    monkeypatch.setattr(S, "resolved_dtype", lambda setting: f"{setting} resolved")
    assert S.Settings.of(config).compute_dtype == "auto resolved"  # the night's path resolves it
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        T.Policy(object.__new__(torch.nn.Module), 16, "auto")
    assert resolved_dtype("auto", "flags : fpu avx2 avx512f avx512_bf16") == "bfloat16"
    assert resolved_dtype("auto", "flags : fpu avx2 amx_bf16 amx_tile") == "bfloat16"
    assert resolved_dtype("auto", "flags : fpu avx2 avx512f") == "float32"  # emulated: slower
    assert resolved_dtype("float32", "flags : avx512_bf16") == "float32"
    assert resolved_dtype("bfloat16", "") == "bfloat16"
