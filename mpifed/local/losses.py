"""The distillation losses of the papers, as pure functions on logits.

Conventions: every loss is a mean over the batch (KL terms are "batchmean": summed over
classes, averaged over samples); temperature-scaled KL terms carry the tau^2 factor (FedCAD's
soft cross-entropy does not, as its paper writes it); the
teacher side never carries a gradient. Paper references are to ``../shared/papers``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _kl_per_sample(student_logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """tau^2 * KL(softmax(teacher/tau) || softmax(student/tau)) for each sample."""
    log_p = F.log_softmax(student_logits / tau, dim=1)
    log_q = F.log_softmax(teacher_logits / tau, dim=1)
    return tau * tau * (log_q.exp() * (log_q - log_p)).sum(dim=1)


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """Hinton et al.'s distillation term: tau^2 * KL(softmax(t/tau) || softmax(s/tau)), batch mean.

    FedGKD Eqs. 3-4 use it with tau = 1 and weight gamma/2.
    """
    return _kl_per_sample(student_logits, teacher_logits.detach(), tau).mean()


def not_true_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The C-1 logits of each sample other than its true class, in class order (B x (C-1))."""
    b, c = logits.shape
    # column j of the result is class j, or j + 1 from the true class on: a gather, so the
    # output's shape never depends on the data (a boolean mask would make the host wait)
    others = torch.arange(c - 1, device=logits.device).expand(b, c - 1)
    return logits.gather(1, others + (others >= targets.view(-1, 1)).long())


def ntd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
             targets: torch.Tensor, tau: float) -> torch.Tensor:
    """FedNTD's not-true distillation (Eq. 11): the KD term over the not-true classes only.

    The true-class logit is removed from both sides before the softmax (not zeroed), so
    the loss does not depend on it and gives it no gradient.
    """
    return kd_loss(not_true_logits(student_logits, targets), not_true_logits(teacher_logits, targets), tau)


def csd_similarity(student_logits: torch.Tensor, global_prototypes: torch.Tensor) -> torch.Tensor:
    """FedCSD Eqs. 8-9: softmax over classes of the cosine similarity between each sample's
    logits and each row of the C x C prototype matrix (a zero row has similarity 0)."""
    sim = F.normalize(student_logits, dim=1) @ F.normalize(global_prototypes, dim=1).T
    return F.softmax(sim, dim=1)


def csd_mask(logits: torch.Tensor, targets: torch.Tensor, kind: str) -> torch.Tensor:
    """FedCSD's sample mask from teacher ``logits`` (softmax at temperature 1): ``adaptive``
    (Eq. 13) keeps samples whose true-class probability exceeds 1/C; ``forcible`` (Eq. 16)
    those the teacher classifies correctly; ``none`` keeps every sample."""
    if kind == "none":
        return torch.ones(len(targets), dtype=logits.dtype, device=logits.device)
    if kind == "forcible":
        return (logits.argmax(dim=1) == targets).to(logits.dtype)
    true_prob = F.softmax(logits, dim=1).gather(1, targets.view(-1, 1)).squeeze(1)
    return (true_prob > 1.0 / logits.shape[1]).to(logits.dtype)


def csd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
             global_prototypes: torch.Tensor, tau: float, similarity_grad: bool = False, refine: bool = True,
             mask: str = "adaptive", mask_from_refined: bool = False) -> torch.Tensor:
    """FedCSD's class-prototype similarity distillation with the adaptive mask (Eqs. 8-14).

    The teacher logits are refined element-wise by the similarity score (Eq. 10; ``refine=False``
    distils the raw teacher logits, the ablation of Table III); the per-sample term is
    tau^2 * KL(softmax(refined/tau) || softmax(student/tau)) (Eq. 11, in the official code's KL
    form: with a target that does not depend on the student it differs from the paper's
    cross-entropy by the target's entropy, a constant; with ``similarity_grad`` the target does
    depend on the student and the two differ in their gradients too); the mask (:func:`csd_mask`;
    Eq. 13 by default, on the teacher's own logits as the paper writes, or on the refined logits
    as the official code computes it, ``mask_from_refined``); the mean is over the whole batch,
    masked samples included (Eq. 14).

    ``similarity_grad=False`` (default) treats the similarity score as part of the target and
    detaches it; the official code lets the gradient flow through it into the student.
    """
    teacher_logits = teacher_logits.detach()
    refined = teacher_logits
    if refine:
        refined = csd_similarity(student_logits if similarity_grad else student_logits.detach(),
                                 global_prototypes) * teacher_logits
    log_p = F.log_softmax(student_logits / tau, dim=1)
    log_q = F.log_softmax(refined / tau, dim=1)
    per_sample = tau * tau * (log_q.exp() * (log_q - log_p)).sum(dim=1)
    keep = csd_mask((refined if mask_from_refined else teacher_logits).detach(), targets, mask)
    return (keep * per_sample).mean()


def one_hot(labels: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """``F.one_hot(labels, num_classes).to(dtype)`` without its check of the labels' range, which
    on the CPU reads their minimum and maximum on the host."""
    return (labels.unsqueeze(1) == torch.arange(num_classes, device=labels.device)).to(dtype)


def class_sums(values: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class sums of the rows of ``values`` (or of its entries, when 1-D) and per-class
    counts, in ``values``' dtype. A matrix product with the one-hot labels, so deterministic on
    GPUs (an index_add would not be)."""
    hot = one_hot(labels, num_classes, values.dtype)
    return hot.T @ values, hot.sum(dim=0)


def cad_class_weights(teacher_probs: torch.Tensor, labels: torch.Tensor, beta: float, gamma: float,
                      num_classes: int) -> torch.Tensor:
    """FedCAD Eq. 6: alpha_y = (gamma-beta)/2 * E_{x|y}[p_y(x) - sum_{k!=y} p_k(x)] + (gamma+beta)/2.

    The expectation is over the auxiliary samples of class y; a class with no auxiliary
    sample gets the lower bound ``beta``. Since the probabilities sum to one, alpha_y =
    beta + (gamma - beta) * E[p_y], which lies in [beta, gamma].
    """
    p_true = teacher_probs.gather(1, labels.view(-1, 1)).squeeze(1)
    margin = 2 * p_true - teacher_probs.sum(dim=1)           # p_y - sum_{k != y} p_k
    sums, counts = class_sums(margin, labels, num_classes)
    mean = sums / counts.clamp(min=1)
    alpha = (gamma - beta) / 2 * mean + (gamma + beta) / 2
    return torch.where(counts > 0, alpha, torch.full_like(alpha, beta))


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """Per sample -sum_k q_k log p_k, q and p the teacher's and student's softmax at temperature tau."""
    log_p = F.log_softmax(student_logits / tau, dim=1)
    q = F.softmax(teacher_logits.detach() / tau, dim=1)
    return -(q * log_p).sum(dim=1)


def cad_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
             class_weights: torch.Tensor, tau: float, tau_squared: bool = False, scale_ce: bool = True) -> torch.Tensor:
    """FedCAD Eq. 5 with Alg. 1's L_d: per sample (1 - alpha_y) * CE + alpha_y * L_d, batch mean,
    L_d = -sum_k p^g_k log p_k with both softmaxes at temperature tau (no tau^2 factor).

    The cross-entropy is at temperature 1 (the paper's Alg. 1 uses CrossEntropyLoss on the
    logits). ``tau_squared`` multiplies L_d by tau^2 (Hinton et al.'s scaling; its gradient is
    that of tau^2 KL). ``scale_ce=False`` keeps the cross-entropy at full weight (CE + alpha_y L_d),
    an ablation that separates the distillation from the smaller cross-entropy step. With a
    constant alpha this is FedLSD; with alpha = 0, plain cross-entropy.
    """
    alpha = class_weights[targets]
    ce = F.cross_entropy(student_logits, targets, reduction="none")
    distill = soft_cross_entropy(student_logits, teacher_logits, tau) * (tau * tau if tau_squared else 1.0)
    return ((1 - alpha if scale_ce else 1.0) * ce + alpha * distill).mean()


def moon_loss(features: torch.Tensor, global_features: torch.Tensor, previous_features: torch.Tensor,
              tau: float) -> torch.Tensor:
    """MOON's model-contrastive loss (Li et al., CVPR 2021, Eq. 3), batch mean:
    -log( e^{cos(z, z_glob)/tau} / (e^{cos(z, z_glob)/tau} + e^{cos(z, z_prev)/tau}) ).

    The global and previous representations carry no gradient.
    """
    positive = F.cosine_similarity(features, global_features.detach(), dim=1) / tau
    negative = F.cosine_similarity(features, previous_features.detach(), dim=1) / tau
    return (torch.logsumexp(torch.stack([positive, negative], dim=1), dim=1) - positive).mean()
