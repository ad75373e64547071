"""Capture tests run their models on one thread: on a busy 2-core machine, two OpenMP threads
that are descheduled at a barrier turn microsecond ops into millisecond ones."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
