"""Session set-up shared by the tests."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def _tokenizer_cache():
    """Convert the offline SmolLM2 tokenizer (used by the tiny test models) once, up front,
    so that tests which start training subprocesses never race to create the cache."""
    from paczero.models import load_tokenizer

    load_tokenizer("tiny-llama")


@pytest.fixture(autouse=True)
def _cpu_without_native_bf16(monkeypatch):
    """In-process tests run as on a CPU without native bf16, whatever the host: ``dtype: auto`` is fp32 there,
    as the tests' exact figures assume (tests/test_hardware.py sets other flags where it needs them)."""
    from paczero import hardware

    monkeypatch.setattr(hardware, "cpu_flags", lambda: set())
