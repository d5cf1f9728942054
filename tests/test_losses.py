"""The losses against hand computations on tiny tensors (numbers written out)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.losses import echo_loss, imitation_loss, imitation_parts, oapl_loss

NAN = float("nan")


def _oapl_inputs():
    # One sequence of 6 tokens; message 0 = tokens 1-2, message 1 = tokens 4-5.
    logp = torch.tensor([[0.0, -1.0, -2.0, -0.5, -1.5, -3.0]], requires_grad=True)
    lag = torch.tensor([[0.0, -1.5, -2.0, -1.0, -1.0, -2.0]])
    # log-ratio:          0    0.5   0    0.5  -0.5  -1.0
    msg = torch.tensor([[-1, 0, 0, -1, 1, 1]])
    adv = torch.tensor([0.2, -0.4])
    return logp, lag, msg, adv


def test_oapl_is_the_mean_squared_gap_between_beta_logratio_and_advantage():
    logp, lag, msg, adv = _oapl_inputs()
    loss, stats = oapl_loss(logp, lag, msg, adv, beta=0.1)
    # message 0: sum 0.5 -> (0.1*0.5 - 0.2)^2 = 0.0225; message 1: sum -1.5 -> (-0.15 + 0.4)^2 = 0.0625
    assert loss.item() == pytest.approx((0.0225 + 0.0625) / 2)
    assert stats["terms"] == 2
    assert stats["logratio_pos"] == pytest.approx(0.5) and stats["n_pos"] == 1
    assert stats["logratio_neg"] == pytest.approx(-1.5) and stats["n_neg"] == 1
    loss.backward()
    # d/dlogp_t = (1/2) * 2 * (beta*S_i - A_i) * beta: message 0 -> -0.015, message 1 -> +0.025
    expected = torch.tensor([[0.0, -0.015, -0.015, 0.0, 0.025, 0.025]])
    assert torch.allclose(logp.grad, expected, atol=1e-7)


def test_oapl_override_token_leaves_its_message_and_adds_its_own_term():
    logp, lag, msg, adv = _oapl_inputs()
    token_adv = torch.tensor([[NAN, NAN, NAN, NAN, NAN, -1.0]])  # the last token: stray end of turn
    loss, stats = oapl_loss(logp, lag, msg, adv, beta=0.1, token_adv=token_adv)
    # message 0: 0.0225; message 1 without token 5: sum -0.5 -> (-0.05 + 0.4)^2 = 0.1225;
    # token 5: (0.1 * -1.0 - (-1.0))^2 = 0.81; mean of three terms.
    assert loss.item() == pytest.approx((0.0225 + 0.1225 + 0.81) / 3)
    assert stats["terms"] == 3
    assert stats["logratio_neg"] == pytest.approx(-0.5)
    assert stats["logratio_token"] == pytest.approx(-1.0) and stats["n_token"] == 1


def test_oapl_skips_messages_without_advantage_and_is_zero_at_the_lag_policy():
    logp, lag, msg, _ = _oapl_inputs()
    adv = torch.tensor([0.2, NAN])  # message 1 was not judged
    loss, stats = oapl_loss(logp, lag, msg, adv, beta=0.1)
    assert loss.item() == pytest.approx(0.0225)
    assert stats["terms"] == 1 and math.isnan(stats["logratio_neg"])
    # At pi_theta = pi_lag the loss is the mean squared advantage.
    loss, _ = oapl_loss(lag.clone(), lag, msg, torch.tensor([0.2, -0.4]))
    assert loss.item() == pytest.approx((0.04 + 0.16) / 2)


def test_oapl_without_any_term_is_zero_and_still_backpropagates():
    logp, lag, _, _ = _oapl_inputs()
    loss, stats = oapl_loss(logp, lag, torch.full((1, 6), -1), torch.zeros(0))
    assert loss.item() == 0.0 and stats["terms"] == 0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))


def test_oapl_treats_pi_lag_as_a_constant():
    logp, lag, msg, adv = _oapl_inputs()
    lag.requires_grad_(True)
    oapl_loss(logp, lag, msg, adv)[0].backward()
    assert lag.grad is None


def test_echo_is_lambda_times_the_mean_of_per_sequence_length_normalised_ce():
    logp = torch.tensor([[0.0, -1.0, -2.0, -3.0],
                         [0.0, -4.0, -1.0, -1.0],
                         [0.0, -9.0, -9.0, -9.0]], requires_grad=True)
    obs = torch.tensor([[False, True, True, False],  # CE (1 + 2) / 2 = 1.5
                        [False, False, False, True],  # CE 1 / 1 = 1.0
                        [False, False, False, False]])  # no observation: not counted
    loss = echo_loss(logp, obs, lam=0.05)
    assert loss.item() == pytest.approx(0.05 * (1.5 + 1.0) / 2)
    loss.backward()
    # d/dlogp = -lam / n_seq / n_obs(b): row 0 -> -0.05/2/2, row 1 -> -0.05/2/1
    expected = torch.tensor([[0, -0.0125, -0.0125, 0], [0, 0, 0, -0.025], [0, 0, 0, 0]])
    assert torch.allclose(logp.grad, expected)


def test_echo_without_observations_is_zero():
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    assert echo_loss(logp, torch.zeros(1, 2, dtype=torch.bool)).item() == 0.0


def test_imitation_is_the_weighted_length_normalised_ce_of_demonstration_tokens():
    logp = torch.tensor([[0.0, -2.0, -4.0], [0.0, -1.0, -1.0]], requires_grad=True)
    demo = torch.tensor([[False, True, True], [False, False, False]])  # only row 0 has one
    loss = imitation_loss(logp, demo, weight=2.0)
    assert loss.item() == pytest.approx(2.0 * (2.0 + 4.0) / 2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -1.0, -1.0], [0.0, 0.0, 0.0]]))
    assert imitation_loss(logp, torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0


def test_imitation_per_token_weighs_every_demonstrated_token_alike():
    """Per sequence, a one-token demonstration's token weighs as much as a three-token one's
    whole; per token, each token is a quarter of the mean."""
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]], requires_grad=True)
    demo = torch.tensor([[True, True, True], [True, False, False]])
    per_sequence = imitation_loss(logp, demo)
    assert per_sequence.item() == pytest.approx(((1 + 2 + 3) / 3 + 4) / 2)
    loss = imitation_loss(logp, demo, weight=2.0, per="token")
    assert loss.item() == pytest.approx(2.0 * (1 + 2 + 3 + 4) / 4)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -0.5, -0.5], [-0.5, 0.0, 0.0]]))
    assert imitation_loss(logp, torch.zeros(2, 3, dtype=torch.bool), per="token").item() == 0.0
    with pytest.raises(ValueError, match="imitation_per is one of sequence, token, choice"):
        imitation_loss(logp, demo, per="word")


def test_imitation_per_choice_weighs_every_choice_and_every_answers_words_alike():
    """Row 0: a call, its head (2 tokens) and its arguments (2); row 1: a choice to answer in
    words (1 token); row 2: an answer's words (1). Per choice: four parts, each its own mean."""
    logp = torch.tensor([[-1.0, -3.0, -2.0, -6.0], [-5.0, 0.0, 0.0, 0.0],
                         [-8.0, 0.0, 0.0, 0.0]], requires_grad=True)
    demo = torch.tensor([[True, True, True, True], [True, False, False, False],
                         [True, False, False, False]])
    head = torch.tensor([[True, True, False, False], [True, False, False, False],
                         [False, False, False, False]])
    loss = imitation_loss(logp, demo, weight=2.0, per="choice", head=head)
    assert loss.item() == pytest.approx(2.0 * ((1 + 3) / 2 + (2 + 6) / 2 + 5 + 8) / 4)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25, -0.25, -0.25],
                                                   [-0.5, 0, 0, 0], [-0.5, 0, 0, 0]]))
    # Per sequence the call's head is half of a quarter-weighted row: here, a part of its own.
    assert imitation_parts(demo, head, "choice") == 4
    assert imitation_parts(demo, head, "sequence") == 3 and imitation_parts(demo, head, "token") == 6
    assert imitation_parts(demo[0], head[0], "choice") == 2  # one example's (T,) masks
    with pytest.raises(ValueError, match="needs the choice tokens"):
        imitation_loss(logp, demo, per="choice")
