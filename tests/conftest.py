"""Fixtures for every test directory."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _threads():
    # Small ops are dominated by OpenMP hand-offs on a shared 2-core machine; one thread keeps tests quick.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
