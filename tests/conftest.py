"""Session set-up shared by the tests."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def _tokenizer_cache():
    """Convert the offline SmolLM2 tokenizer (used by the tiny test models) once, up front,
    so that tests which start training subprocesses never race to create the cache."""
    from paczero.models import load_tokenizer

    load_tokenizer("tiny-llama")
