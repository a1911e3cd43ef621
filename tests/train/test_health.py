"""The divergence checks of :class:`selfsup.train.signals.TrainingHealth` (issue 31.3): thresholds, state."""

from __future__ import annotations

import math

import torch
from torch import nn

from selfsup.train.signals import LOSS_RATIO, LOSS_WINDOW, TrainingHealth, weight_norm


def feed(health: TrainingHealth, losses: list[float]) -> list[str | None]:
    return [health.loss_problem(x) for x in losses]


def test_a_loss_100x_its_running_median_is_divergence_but_moves_by_a_few_are_not() -> None:
    health = TrainingHealth()
    # VICReg-like: 25 down to 20, with a spike of 4x; then a jump of four orders of magnitude.
    assert feed(health, [25.0, 24.6, 22.9, 90.0, 21.0, 20.5]) == [None] * 6
    problem = health.loss_problem(5e5)
    assert problem is not None and "running median 23.75" in problem and "> 100x" in problem
    assert health.loss_problem(float("nan")) == "loss is nan"


def test_losses_near_zero_or_crossing_it_do_not_trip() -> None:
    """MSN's loss (cross-entropy minus the ME-MAX entropy) starts near 0 and goes negative; BYOL's goes to ~0."""
    health = TrainingHealth()
    assert feed(health, [0.01, -0.4, -1.5, -2.2, -2.0, 0.3, 1e-4]) == [None] * 7
    health = TrainingHealth()
    assert feed(health, [3.9, 0.5, 0.02, 0.01, 0.01, 0.3, 2.0]) == [None] * 7
    assert health.loss_problem(150.0) is not None  # past 100 x max(median, 0.1 x first loss, 1)


def test_the_state_resumes_the_window() -> None:
    health = TrainingHealth()
    feed(health, [float(x) for x in range(1, LOSS_WINDOW + 11)])
    resumed = TrainingHealth(health.state())
    assert list(resumed.losses) == list(health.losses) and len(resumed.losses) == LOSS_WINDOW
    assert resumed.first_loss == 1.0
    big = LOSS_RATIO * 40.0  # the median of the last 50 of 1..60 is 35.5: 4000 is 112x it
    assert (health.loss_problem(big) is None) == (resumed.loss_problem(big) is None) is False
    fresh = TrainingHealth(None)  # an older checkpoint without the key
    assert fresh.state() == {"losses": [], "first_loss": None, "start_norm": None}


def test_weight_norm_growth_past_1000x_is_exploding() -> None:
    model = nn.Linear(4, 4, bias=False)  # the weight is the whole norm: growth = the factor applied
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    health = TrainingHealth()
    health.start(model)
    assert math.isclose(health.start_norm, weight_norm(model), rel_tol=1e-6)
    with torch.no_grad():
        model.weight.mul_(20.0)
    assert health.weights_problem(model, optimizer) is None
    with torch.no_grad():
        model.weight.mul_(60.0)
    problem = health.weights_problem(model, optimizer)
    assert problem is not None and "the weights are exploding" in problem
