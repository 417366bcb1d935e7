from mpifed.algorithms.scaffold import effective_steps


def test_effective_steps_match_momentum_displacement():
    lr, beta, g = 0.1, 0.9, 1.0
    for k in (1, 5, 40):
        w, buf = 0.0, None
        for _ in range(k):
            buf = g if buf is None else beta * buf + g
            w -= lr * buf
        assert abs(-w / (lr * g) - effective_steps(k, beta)) < 1e-9
    assert effective_steps(7, 0.0) == 7.0
