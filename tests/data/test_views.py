from __future__ import annotations

import dataclasses

import pytest
import torch

from selfsup.data.augment import augment_config
from selfsup.data.views import ViewGroup, make_views


def test_msn_style_views_in_spec_order() -> None:
    groups = [ViewGroup(augment_config("msn", 16), 1), ViewGroup(augment_config("msn", 16), 1),
              ViewGroup(augment_config("msn_focal", 8), 10)]
    torch.manual_seed(0)
    views = make_views(torch.rand(4, 3, 20, 20), groups)
    assert [tuple(v.shape) for v in views] == [(4, 3, 16, 16)] * 2 + [(4, 3, 8, 8)] * 10
    assert not torch.equal(views[2], views[3])  # focal crops are independent draws


def test_multiview_identical_spec_gives_distinct_views() -> None:
    torch.manual_seed(0)
    views = make_views(torch.rand(3, 3, 12, 12), [ViewGroup(augment_config("multiview", 12), 4)])
    assert len(views) == 4
    assert all(not torch.equal(views[i], views[j]) for i in range(4) for j in range(i))


def test_make_views_reproducible_under_seed() -> None:
    groups = [ViewGroup(augment_config("byol_view1", 8), 1), ViewGroup(augment_config("byol_view2", 8), 1)]
    x = torch.rand(2, 3, 10, 10)
    torch.manual_seed(3)
    a = make_views(x, groups)
    torch.manual_seed(3)
    b = make_views(x, groups)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_shared_crop_views_differ_in_colour_only() -> None:
    """ExtreMA's "shared crop + colour": one crop and flip per image, then independent colour per view."""
    x = torch.rand(8, 3, 24, 24)
    config = augment_config("extrema", 16, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    geometry_only = dataclasses.replace(config, jitter_p=0.0, grayscale_p=0.0)
    torch.manual_seed(0)
    same = make_views(x, [ViewGroup(geometry_only, 2, shared_crop=True)])
    assert torch.equal(same[0], same[1])  # without colour ops the two views are one crop
    torch.manual_seed(0)
    independent = make_views(x, [ViewGroup(geometry_only, 2)])
    assert not torch.equal(independent[0], independent[1])  # an independent crop per view
    # with colour: each view is the shared crop with its own jitter / grayscale, normalised
    torch.manual_seed(0)
    coloured = make_views(x, [ViewGroup(config, 2, shared_crop=True)])
    assert not torch.equal(coloured[0], coloured[1])
    torch.manual_seed(0)
    crop = ViewGroup(config, 2, shared_crop=True).crop(x)  # the group draws its crop first, from the same seed
    assert crop.shape == (8, 3, 16, 16) and 0.0 <= crop.min() and crop.max() <= 1.0  # not normalised yet
    plain = torch.tensor([not ((v * 0.25 + 0.5) - crop).abs().amax() > 1e-5 for v in coloured[0]])
    gray_or_jittered = ~plain
    assert gray_or_jittered.any()  # some images were recoloured ...
    assert torch.allclose(coloured[0][plain] * 0.25 + 0.5, crop[plain], atol=1e-5)  # ... the rest are the crop itself


def test_view_group_errors() -> None:
    with pytest.raises(ValueError, match="at least one ViewGroup"):
        make_views(torch.rand(1, 3, 8, 8), [])
    with pytest.raises(ValueError, match="num >= 1"):
        ViewGroup(augment_config("minimal", 8), 0)


def test_step_views_move_the_groups_normalisation_to_their_device() -> None:
    """The views are made where the step runs: a group's mean/std left on the CPU broke every CUDA run (the
    normalisation mixed cuda and cpu tensors). The meta device stands in for CUDA here."""
    from selfsup.data.imagedata import ImageData
    from selfsup.data.sampler import StepSampler
    from selfsup.train.views import StepViews

    group = ViewGroup(augment_config("simclr", 8, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)), num=2)
    data = ImageData(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), None, None)
    views = StepViews(data, StepSampler(4, 2), [group], 0, 0, 1, torch.device("meta"), torch.contiguous_format)
    assert [b.device.type for g in views.groups for b in g.buffers()] == ["meta"] * 4  # mean, std of Augment


def test_run_by_size_calls_once_per_run_of_one_size_in_view_order() -> None:
    from selfsup.data.views import run_by_size

    views = [torch.full((2, 1, s, s), float(i)) for i, s in enumerate([8, 8, 4, 4, 4, 8])]
    calls = []
    out = run_by_size(lambda x: calls.append(tuple(x.shape)) or x.mean((1, 2, 3)), views)
    assert calls == [(4, 1, 8, 8), (6, 1, 4, 4), (2, 1, 8, 8)]  # consecutive runs, as their MultiCropWrapper
    assert torch.cat(out).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert run_by_size(lambda x: x, []) == []
