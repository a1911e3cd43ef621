"""Shared test settings: one intra-op thread (tiny tensors run faster so, and parallel workers don't fight)."""

import torch

torch.set_num_threads(1)
