"""Shared test settings: one intra-op thread (tiny tensors run faster so, and parallel workers don't fight)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread_after_each_test():
    """A test that trains a config with ``trainer.num_threads`` leaves torch at that count: put it back, so tests
    that compare with a one-thread reference (resume exactness) do not depend on which tests ran before them."""
    yield
    torch.set_num_threads(1)
