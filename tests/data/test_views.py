from __future__ import annotations

import pytest
import torch

from selfsup.data.augment import Augment, augment_config
from selfsup.data.views import ViewSpec, make_views


def test_msn_style_views_in_spec_order() -> None:
    specs = [ViewSpec(1, augment_config("msn", 16)), ViewSpec(1, augment_config("msn", 16)),
             ViewSpec(10, augment_config("msn_focal", 8))]
    augmenters = [Augment(s.augment) for s in specs]
    torch.manual_seed(0)
    views = make_views(torch.rand(4, 3, 20, 20), specs, augmenters)
    assert [tuple(v.shape) for v in views] == [(4, 3, 16, 16)] * 2 + [(4, 3, 8, 8)] * 10
    assert not torch.equal(views[2], views[3])  # focal crops are independent draws


def test_multiview_identical_spec_gives_distinct_views() -> None:
    spec = ViewSpec(4, augment_config("multiview", 12))
    torch.manual_seed(0)
    views = make_views(torch.rand(3, 3, 12, 12), [spec], [Augment(spec.augment)])
    assert len(views) == 4
    assert all(not torch.equal(views[i], views[j]) for i in range(4) for j in range(i))


def test_make_views_reproducible_under_seed() -> None:
    specs = [ViewSpec(1, augment_config("byol_view1", 8)), ViewSpec(1, augment_config("byol_view2", 8))]
    augmenters = [Augment(s.augment) for s in specs]
    x = torch.rand(2, 3, 10, 10)
    torch.manual_seed(3)
    a = make_views(x, specs, augmenters)
    torch.manual_seed(3)
    b = make_views(x, specs, augmenters)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_make_views_errors() -> None:
    spec = ViewSpec(2, augment_config("minimal", 8))
    with pytest.raises(ValueError, match="one Augment per ViewSpec"):
        make_views(torch.rand(1, 3, 8, 8), [spec], [])
    with pytest.raises(ValueError, match="different AugmentConfig"):
        make_views(torch.rand(1, 3, 8, 8), [spec], [Augment(augment_config("simclr", 8))])
    with pytest.raises(ValueError, match="num"):
        ViewSpec(0, augment_config("minimal", 8))
    with pytest.raises(TypeError, match="AugmentConfig"):
        ViewSpec(1, dict(size=8))  # type: ignore[arg-type]
