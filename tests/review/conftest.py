"""Fixtures for the review/refactor tests: one tiny random checkpoint (real byte-level tokenizer) per session."""

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from engine.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-review"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_dir):
    from engine import Engine

    return Engine.load(str(tiny_dir), device="cpu", backend="reference", max_seq_len=512)
