"""The linear probe, low-shot fits and k-means restarts show progress bars when asked (and only then)."""

from __future__ import annotations

import numpy as np

from selfsup.eval.clustering import kmeans_cluster
from selfsup.eval.linear import linear_probe
from selfsup.eval.lowshot import lowshot_logistic


def test_evaluations_report_progress_on_request(capsys):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 6)).astype(np.float32), np.repeat(np.arange(4), 50)
    for progress in (False, True):
        linear_probe(x, y, x, y, lrs=[1e-2], weight_decays=[0.0], epochs=2, progress=progress)
        lowshot_logistic(x, y, x, y, shots=[1], percents=[], num_splits=2, progress=progress)
        kmeans_cluster(x, y, n_init=2, progress=progress)
        err = capsys.readouterr().err
        for label in ("linear probe: 1 (lr, wd) pairs", "linear probe: final head", "low-shot fits", "k-means restarts"):
            assert (label in err) == progress, (label, progress)
