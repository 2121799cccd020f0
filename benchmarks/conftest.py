"""``--tiny``: every workload at a small shape of the same rank, dtype, layout and
operator, so CI can run each benchmark once in seconds and they cannot rot."""

import dataclasses

import pytest

from normkernels.bench import workloads


def pytest_addoption(parser):
    parser.addoption("--tiny", action="store_true",
                     help="run every workload at a tiny shape (a smoke run)")


def tiny(workload):
    shape = (2, 3, *([5] * (len(workload.shape) - 2))) if len(workload.shape) > 2 else (4, 3)
    return dataclasses.replace(workload, shape=shape)


@pytest.fixture
def sized(request):
    """The workload as given, or tiny under --tiny."""
    return tiny if request.config.getoption("--tiny") else (lambda w: w)


@pytest.fixture
def small():
    """The workload at its tiny shape, with or without --tiny (correctness checks)."""
    return tiny


@pytest.fixture(scope="session")
def flush():
    return workloads.CacheFlusher()
