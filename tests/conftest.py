"""Session set-up shared by the tests."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def _tokenizer_cache():
    """Convert the offline SmolLM2 tokenizer (used by the tiny test models) once, up front,
    so that tests which start training subprocesses never race to create the cache."""
    from paczero.models import load_tokenizer

    load_tokenizer("tiny-llama")


@pytest.fixture(scope="session", autouse=True)
def _cpu_without_native_bf16():
    """Every test runs as on a CPU without native bf16, whatever the host: ``dtype: auto`` is fp32, as the
    tests' exact figures assume. The flags are given by ``PACZERO_CPU_FLAGS`` (empty: none), which
    ``paczero.machine.hardware.cpu_flags`` reads in this process and in every ``paczero`` process a test starts, so a
    subprocess training resolves auto as the test does (tests/test_hardware.py names other flags where it
    needs them). Session-wide, so that module fixtures (a run several tests read) are made under it too."""
    from paczero.machine.hardware import CPU_FLAGS_ENV

    patch = pytest.MonkeyPatch()
    patch.setenv(CPU_FLAGS_ENV, "")
    yield
    patch.undo()


@pytest.fixture(scope="session", autouse=True)
def _no_busy_line():
    """The one-time "machine busy" line depends on the load of the machine the suite runs on: off in every test
    and the processes it starts (``PACZERO_BUSY_LINE=0``); tests/test_busy.py turns it on where it tests it."""
    from paczero.machine.busy import BUSY_LINE_ENV

    patch = pytest.MonkeyPatch()
    patch.setenv(BUSY_LINE_ENV, "0")
    yield
    patch.undo()
