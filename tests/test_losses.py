"""The public losses against values computed by hand, and their properties."""
import math

import pytest
import torch

from mpifed.local.losses import (cad_class_weights, cad_loss, csd_loss, csd_mask, csd_similarity, kd_loss,
                                 not_true_logits, ntd_loss)

LN = math.log


def softmax(v):
    e = [math.exp(x) for x in v]
    return [x / sum(e) for x in e]


def kl(q, p):
    return sum(a * (LN(a) - LN(b)) for a, b in zip(q, p))


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_kd_loss_hand_value():
    # teacher softmax [3/4, 1/4], student [1/2, 1/2]: KL = 3/4 ln(3/2) + 1/4 ln(1/2)
    assert kd_loss(t([0.0, 0.0]),
                   t([LN(3), 0.0]), 1.0).item() == pytest.approx(0.75 * LN(1.5) + 0.25 * LN(0.5), abs=1e-12)


def test_kd_loss_temperature_and_batch_mean():
    s, te, tau = [1.0, 2.0, 3.0], [3.0, 2.0, 1.0], 2.0
    one = tau ** 2 * kl(softmax([x / tau for x in te]), softmax([x / tau for x in s]))
    got = kd_loss(t(s, [0.0, 0.0, 0.0]), t(te, [0.0, 0.0, 0.0]), tau).item()
    assert got == pytest.approx(one / 2, abs=1e-12)  # the second sample contributes 0


def test_ntd_loss_removes_the_true_class():
    s, te = [5.0, 1.0, 2.0, 0.5], [-3.0, 0.2, 1.0, 2.0]
    expected = 4.0 * kl(softmax([x / 2 for x in te[1:]]), softmax([x / 2 for x in s[1:]]))
    assert ntd_loss(t(s), t(te), torch.tensor([0]), 2.0).item() == pytest.approx(expected, abs=1e-12)
    assert not_true_logits(t([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),
                           torch.tensor([1, 2])).tolist() == [[1.0, 3.0], [4.0, 5.0]]


def test_ntd_loss_does_not_depend_on_true_class_logits():
    torch.manual_seed(0)
    s, te, y = torch.randn(6, 10, dtype=torch.float64), torch.randn(6, 10,
                                                                    dtype=torch.float64), torch.randint(0, 10, (6,))
    s2, te2 = s.clone(), te.clone()
    s2[torch.arange(6), y] += 7.0
    te2[torch.arange(6), y] -= 3.0
    assert ntd_loss(s, te, y, 1.0).item() == pytest.approx(ntd_loss(s2, te2, y, 1.0).item(), abs=1e-12)
    s.requires_grad_(True)
    ntd_loss(s, te, y, 1.0).backward()
    assert torch.all(s.grad[torch.arange(6), y] == 0)


def test_ntd_loss_and_its_gradient_vanish_where_the_student_is_the_teacher():
    # a client's first local step starts from the global model: FedNTD's term adds nothing there
    torch.manual_seed(1)
    logits, y = torch.randn(8, 10, dtype=torch.float64), torch.randint(0, 10, (8,))
    student = logits.clone().requires_grad_(True)
    loss = ntd_loss(student, logits.clone(), y, 1.0)
    loss.backward()
    assert abs(loss.item()) < 1e-15 and student.grad.abs().max().item() < 1e-15


def test_csd_loss_hand_value():
    # prototypes: identity; sample 0 (label 0) passes the mask, sample 1 (label 1) does not
    student = t([1.0, 0.0], [1.0, 0.0])
    teacher = t([2.0, 1.0], [2.0, 1.0])
    protos = t([1.0, 0.0], [0.0, 1.0])
    score = softmax([1.0, 0.0])                               # cosines [1, 0], then Eq. 9
    refined = [score[0] * 2.0, score[1] * 1.0]                # Eq. 10
    term = kl(softmax(refined), softmax([1.0, 0.0]))          # tau = 1
    got = csd_loss(student, teacher, torch.tensor([0, 1]), protos, 1.0).item()
    assert got == pytest.approx(term / 2, abs=1e-12)          # the masked sample counts in the mean
    assert csd_similarity(student, protos)[0].tolist() == pytest.approx(score, abs=1e-12)


def test_csd_loss_with_temperature_and_zero_prototype_row():
    student, teacher = t([0.5, -1.0, 2.0]), t([3.0, 0.0, 1.0])
    protos = t([1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0])
    n = math.sqrt(0.25 + 1 + 4)
    cos = [(0.5 - 1.0) / (n * math.sqrt(2)), 0.0, (-1.0 + 2.0) / (n * math.sqrt(2))]
    refined = [w * z for w, z in zip(softmax(cos), [3.0, 0.0, 1.0])]
    expected = 16.0 * kl(softmax([z / 4 for z in refined]), softmax([z / 4 for z in [0.5, -1.0, 2.0]]))
    assert csd_loss(student, teacher, torch.tensor([0]), protos, 4.0).item() == pytest.approx(expected, abs=1e-12)


def test_csd_loss_is_zero_when_the_mask_is_all_zero():
    student, teacher = torch.randn(5, 4, dtype=torch.float64), torch.zeros(5, 4, dtype=torch.float64)
    teacher[:, 0] = 10.0                       # the teacher is sure of class 0; every label is 1
    assert csd_loss(student, teacher, torch.ones(5, dtype=torch.long),
                    torch.eye(4, dtype=torch.float64), 10.0).item() == 0.0


def test_csd_mask_variants_hand_values():
    # teacher softmax at T = 1: sample 0 [0.6, 0.3, 0.1] (label 1: 0.3 <= 1/3), sample 1 [0.2, 0.5, 0.3]
    # (label 2: 0.3 <= 1/3, not the argmax), sample 2 [0.2, 0.45, 0.35] (label 1: above 1/3 and the argmax)
    probs = t([0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.2, 0.45, 0.35])
    logits, y = probs.log(), torch.tensor([1, 2, 1])
    assert csd_mask(logits, y, "adaptive").tolist() == [0.0, 0.0, 1.0]
    assert csd_mask(logits, y, "forcible").tolist() == [0.0, 0.0, 1.0]
    assert csd_mask(logits, torch.tensor([0, 1, 2]), "forcible").tolist() == [1.0, 1.0, 0.0]
    assert csd_mask(logits, torch.tensor([0, 1, 2]), "adaptive").tolist() == [1.0, 1.0, 1.0]   # 0.35 > 1/3
    assert csd_mask(logits, y, "none").tolist() == [1.0, 1.0, 1.0]


def test_csd_mask_from_refined_logits_and_without_refinement():
    # identity prototypes, student [1, 0]: score softmax([1, 0]) = [s0, s1]; teacher [0, 0.5] (label 1)
    student, teacher, protos, y = t([1.0, 0.0]), t([0.0, 0.5]), t([1.0, 0.0], [0.0, 1.0]), torch.tensor([1])
    s0, s1 = softmax([1.0, 0.0])
    refined = [s0 * 0.0, s1 * 0.5]                            # [0, 0.134]: the teacher's class 1 stays on top
    term = kl(softmax(refined), softmax([1.0, 0.0]))
    assert csd_loss(student, teacher, y, protos, 1.0).item() == pytest.approx(term, abs=1e-12)
    assert csd_loss(student, teacher, y, protos, 1.0, mask_from_refined=True).item() == pytest.approx(term, abs=1e-12)
    raw = kl(softmax([0.0, 0.5]), softmax([1.0, 0.0]))        # Table III without refinement: the raw teacher
    assert csd_loss(student, teacher, y, protos, 1.0, refine=False).item() == pytest.approx(raw, abs=1e-12)
    # a teacher whose refined logits lose the true class: [1, 1.2] -> refined [0.731, 0.323]
    teacher2 = t([1.0, 1.2])
    refined2 = [s0 * 1.0, s1 * 1.2]
    assert softmax(refined2)[1] < 0.5 < softmax([1.0, 1.2])[1]
    assert csd_loss(student, teacher2, y, protos, 1.0, mask_from_refined=True).item() == 0.0
    assert csd_loss(student, teacher2,
                    y, protos, 1.0).item() == pytest.approx(kl(softmax(refined2), softmax([1.0, 0.0])), abs=1e-12)


def test_csd_similarity_gradient_option():
    torch.manual_seed(1)
    s, te = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64) * 3
    y, p = torch.randint(0, 5, (4,)), torch.randn(5, 5, dtype=torch.float64)
    grads = []
    for flag in (False, True):
        x = s.clone().requires_grad_(True)
        csd_loss(x, te, y, p, 2.0, similarity_grad=flag).backward()
        grads.append(x.grad)
    assert not torch.allclose(grads[0], grads[1])


def test_cad_class_weights_hand_values():
    probs = t([0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.1, 0.8, 0.1])
    w = cad_class_weights(probs, torch.tensor([0, 0, 1]), 0.2, 0.6, 3)
    # class 0: margins 0.4 and 0.0, mean 0.2 -> 0.2 * 0.2 + 0.4; class 1: margin 0.6; class 2: no sample -> beta
    assert w.tolist() == pytest.approx([0.44, 0.52, 0.2], abs=1e-12)


def test_cad_class_weights_stay_within_bounds():
    torch.manual_seed(2)
    probs = torch.softmax(torch.randn(200, 7, dtype=torch.float64) * 3, dim=1)
    w = cad_class_weights(probs, torch.randint(0, 7, (200,)), 0.3, 0.7, 7)
    assert torch.all(w >= 0.3 - 1e-12) and torch.all(w <= 0.7 + 1e-12)


def test_cad_loss_hand_value():
    # alpha_y = 0.3: 0.7 * CE (ln 2) + 0.3 * L_d, L_d = -(3/4 ln 1/2 + 1/4 ln 1/2) = ln 2 (Alg. 1: a cross-entropy)
    got = cad_loss(t([0.0, 0.0]), t([LN(3), 0.0]), torch.tensor([1]),
                   torch.tensor([0.1, 0.3], dtype=torch.float64), 1.0).item()
    assert got == pytest.approx(0.7 * LN(2) + 0.3 * LN(2), abs=1e-12)
    full_ce = cad_loss(t([0.0, 0.0]), t([LN(3), 0.0]), torch.tensor([1]), torch.tensor([0.1, 0.3], dtype=torch.float64),
                       1.0, scale_ce=False).item()
    assert full_ce == pytest.approx(LN(2) + 0.3 * LN(2), abs=1e-12)


def test_cad_distillation_is_the_papers_cross_entropy_at_tau_without_tau_squared():
    # tau = 2: student logits [0, 2] -> softmax at tau [1, e] / (1 + e); teacher [2 ln 3, 0] -> [3/4, 1/4]
    student, teacher = t([0.0, 2.0]), t([2 * LN(3), 0.0])
    y, w = torch.tensor([0]), torch.tensor([1.0, 1.0], dtype=torch.float64)
    p = [1 / (1 + math.e), math.e / (1 + math.e)]
    soft_ce = -(0.75 * math.log(p[0]) + 0.25 * math.log(p[1]))
    assert cad_loss(student, teacher, y, w, 2.0).item() == pytest.approx(soft_ce, abs=1e-12)
    assert cad_loss(student, teacher, y, w, 2.0, tau_squared=True).item() == pytest.approx(4 * soft_ce, abs=1e-12)


def test_cad_loss_with_zero_weights_is_cross_entropy():
    s, te, y = torch.randn(8, 5), torch.randn(8, 5), torch.randint(0, 5, (8,))
    expected = torch.nn.functional.cross_entropy(s, y).item()
    assert cad_loss(s, te, y, torch.zeros(5), 2.0).item() == pytest.approx(expected, abs=1e-6)


def test_identical_student_and_teacher_give_zero_kl():
    z, y = torch.randn(6, 8, dtype=torch.float64), torch.randint(0, 8, (6,))
    assert kd_loss(z, z, 3.0).item() == pytest.approx(0.0, abs=1e-12)
    assert ntd_loss(z, z, y, 3.0).item() == pytest.approx(0.0, abs=1e-12)
    q = torch.softmax(z / 2.0, dim=1)        # FedCAD's cross-entropy form: the teacher's entropy remains
    entropy = -(q * q.log()).sum(dim=1).mean().item()
    assert cad_loss(z, z, y, torch.ones(8, dtype=torch.float64), 2.0).item() == pytest.approx(entropy, abs=1e-12)


@pytest.mark.parametrize("loss", [
    lambda s, te, y: kd_loss(s, te, 2.0),
    lambda s, te, y: ntd_loss(s, te, y, 2.0),
    lambda s, te, y: csd_loss(s, te, y, torch.eye(5), 2.0),
    lambda s, te, y: cad_loss(s, te, y, torch.full((5,), 0.5), 2.0),
])
def test_teacher_side_carries_no_gradient(loss):
    s, te, y = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5, requires_grad=True), torch.tensor([0, 1, 2, 3])
    loss(s, te, y).backward()
    assert te.grad is None and s.grad is not None
