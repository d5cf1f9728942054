"""The night's losses: OAPL, ECHO and imitation, each a pure torch function.

Inputs are per-token log-probabilities already gathered at the target token:
``logp[b, t] = log pi(ids[b, t] | ids[b, <t])`` (shape ``(B, T)``).

OAPL (arXiv 2602.19362), per judged assistant message i with advantage A_i::

    loss = mean_i ( beta * sum_{t in y_i} [log pi_theta - log pi_lag] - A_i )^2

A token-level override (e.g. the stray end-of-turn token, A_tok = -1) is one
more action of its own: the token leaves its message's sum and adds the term
``(beta * (log pi_theta_t - log pi_lag_t) - A_tok)^2``, averaged in with the
message terms. So the message's advantage speaks for the rest of the message,
and the override alone for that token. pi_lag is constant (detached).

ECHO (arXiv 2605.24517): ``lam * mean_b [ -sum_t logp_obs / n_obs(b) ]``, the
cross-entropy of each sequence's observation tokens normalised by their count
(so a long tool output weighs as much as a short one), averaged over the
sequences that have any.

Imitation: ``weight * mean_b [ -sum_t logp_demo / n_demo(b) ]``, the same
length-normalised cross-entropy as ECHO, on the tokens of a demonstration (a
practice task's reference answer, given because none of the attempts passed);
or, per token (``train.imitation_per``), ``weight * [ -sum_b,t logp_demo / N ]`` with N
the demonstrated tokens of the whole batch; or, per choice, the per-sequence form with each
sequence's demonstrated choices under the tool list (``head``: ``message:`` or
``functions.NAME:``) and its other demonstrated tokens as two parts, each normalised by
its own count, averaged over the parts that have any (a part is a whole spelled head,
``functions.write_file:`` or ``message:`` and the spelled end, not only its deciding token).
OAPL does not fit those: it regresses beta * log-ratio onto A, i.e. it moves a
message by at most A / beta nats (8 for A = 0.8, beta = 0.1), and assumes the
message was sampled from pi_lag. A reference the model would never write
(log pi_lag of -30 nats over its tokens) is still improbable after +8 nats,
so OAPL alone leaves a task no attempt could pass where it was; supervised
likelihood has no such ceiling.

SDFT (self-distillation from privileged context) is on the road map
(docs/learning.md), not here: it needs whole-vocabulary distributions per chunk,
and no night stage produces a teacher for it yet.
"""

from __future__ import annotations

from typing import Literal

import torch

_NONE = float("nan")
IMITATION_PER = ("sequence", "token", "choice")  # train.imitation_per's values


def oapl_loss(
    logp: torch.Tensor,  # (B, T) log pi_theta of each token
    logp_lag: torch.Tensor,  # (B, T) log pi_lag of each token
    msg_index: torch.Tensor,  # (B, T) long: index into advantages, -1 for other tokens
    advantages: torch.Tensor,  # (M,) A_i per message; NaN for messages not judged
    beta: float = 0.1,
    token_adv: torch.Tensor | None = None,  # (B, T) A_tok per token; NaN where none
) -> tuple[torch.Tensor, dict[str, float]]:
    """OAPL's squared regression of beta * log-ratio onto the advantage.

    Returns the loss (mean over terms; 0 with a graph when there are none) and
    stats: ``terms``, the mean message log-ratio (nats) of positively and of
    negatively rewarded messages with their counts, and that of overridden
    tokens. A runaway negative log-ratio (tens of nats) is the first sign of
    collapse.
    """
    ratio = logp - logp_lag.detach()  # (B, T)
    index = msg_index
    overridden = torch.zeros_like(ratio, dtype=torch.bool)  # (B, T)
    if token_adv is not None:
        overridden = ~torch.isnan(token_adv)
        index = index.masked_fill(overridden, -1)  # an overridden token leaves its message
    in_message = index >= 0  # (B, T)
    m = advantages.shape[0]
    sums = ratio.new_zeros(m).index_add(0, index[in_message], ratio[in_message])  # (M,)
    counts = ratio.new_zeros(m).index_add(
        0, index[in_message], torch.ones_like(ratio[in_message]))  # (M,)
    judged = (counts > 0) & ~torch.isnan(advantages)  # (M,)
    message_terms = (beta * sums[judged] - advantages[judged]) ** 2  # (M',)
    token_terms = ratio.new_zeros(0)
    if token_adv is not None:
        token_terms = (beta * ratio[overridden] - token_adv[overridden]) ** 2  # (K,)
    terms = torch.cat([message_terms, token_terms])  # (M' + K,)
    loss = terms.mean() if terms.numel() else logp.sum() * 0.0

    with torch.no_grad():
        positive = judged & (advantages > 0)
        negative = judged & (advantages < 0)
        stats = {
            "terms": float(terms.numel()),
            "logratio_pos": _mean(sums[positive]),
            "n_pos": float(positive.sum()),
            "logratio_neg": _mean(sums[negative]),
            "n_neg": float(negative.sum()),
            "logratio_token": _mean(ratio[overridden]),
            "n_token": float(overridden.sum()),
        }
    return loss, stats


def masked_nll(
    logp: torch.Tensor,  # (B, T) log pi_theta of each token
    mask: torch.Tensor,  # (B, T) bool: the tokens to predict
) -> torch.Tensor:
    """Mean over the sequences that have masked tokens of their length-normalised NLL."""
    n = mask.to(logp.dtype).sum(dim=1)  # (B,)
    has = n > 0  # (B,)
    if not bool(has.any()):
        return logp.sum() * 0.0
    nll = -(torch.where(mask, logp, torch.zeros_like(logp))).sum(dim=1)  # (B,)
    return (nll[has] / n[has]).mean()


def echo_loss(
    logp: torch.Tensor,  # (B, T) log pi_theta of each token
    obs_mask: torch.Tensor,  # (B, T) bool: observation tokens
    lam: float = 0.05,
) -> torch.Tensor:
    """lam * mean over sequences of the length-normalised CE of their observation tokens."""
    return lam * masked_nll(logp, obs_mask)


def token_nll(
    logp: torch.Tensor,  # (B, T) log pi_theta of each token
    mask: torch.Tensor,  # (B, T) bool: the tokens to predict
) -> torch.Tensor:
    """Mean NLL over all the masked tokens of the batch, whichever sequence holds them."""
    n = mask.to(logp.dtype).sum()
    if not bool(n > 0):
        return logp.sum() * 0.0
    return -torch.where(mask, logp, torch.zeros_like(logp)).sum() / n


def choice_nll(
    logp: torch.Tensor,  # (B, T) log pi_theta of each token
    mask: torch.Tensor,  # (B, T) bool: the tokens to predict
    head: torch.Tensor,  # (B, T) bool: choice tokens (trainer.tokens' heads)
) -> torch.Tensor:
    """``masked_nll`` with each sequence's choice tokens and its other tokens as two parts."""
    return masked_nll(torch.cat([logp, logp]), torch.cat([mask & head, mask & ~head]))


def imitation_parts(demo: torch.Tensor, head: torch.Tensor,
                    per: Literal["sequence", "token", "choice"]) -> int:
    """How many terms ``imitation_loss`` averages over for these (T,) or (B, T) masks: the
    batch mean across micro-batches and processes is their share-weighted sum."""
    _check_per(per)
    if per == "token":
        return int(demo.sum())
    rows = demo.reshape(-1, demo.shape[-1])
    if per == "sequence":
        return int(rows.any(dim=1).sum())
    heads = head.reshape(rows.shape)
    return int((rows & heads).any(dim=1).sum() + (rows & ~heads).any(dim=1).sum())


def imitation_loss(
    logp: torch.Tensor,  # (B, T) log pi_theta of each token
    demo_mask: torch.Tensor,  # (B, T) bool: tokens of demonstrated answers
    weight: float = 1.0,
    per: Literal["sequence", "token", "choice"] = "sequence",
    head: torch.Tensor | None = None,  # (B, T) bool: choice tokens, for per "choice"
) -> torch.Tensor:
    """weight * the demonstrations' CE: per ``"sequence"``, the mean over sequences of each
    one's length-normalised CE; per ``"token"``, the mean over all demonstrated tokens; per
    ``"choice"``, per sequence with its choices and its words as two parts.

    Per sequence, a short demonstration's tokens each weigh more than a long one's: under
    a tool list a text answer's demonstration is its choice to answer in words (a few
    tokens), a tool demonstration its call and arguments (tens), so the choice of words is
    pushed several times harder than the choice of a call. Per token both count alike, and
    a short answer's words count little; per choice every demonstration's choice counts
    alike and so does every answer's words."""
    _check_per(per)
    if per == "sequence":
        return weight * masked_nll(logp, demo_mask)
    if per == "token":
        return weight * token_nll(logp, demo_mask)
    if head is None:
        raise ValueError("imitation per choice needs the choice tokens (head)")
    return weight * choice_nll(logp, demo_mask, head)


def _check_per(per: str) -> None:
    if per not in IMITATION_PER:
        raise ValueError(f"train.imitation_per is one of {', '.join(IMITATION_PER)}, not {per!r}")


def _mean(values: torch.Tensor) -> float:
    return float(values.mean()) if values.numel() else _NONE
