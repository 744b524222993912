"""Shared fixtures for the language-server tests: one tiny random checkpoint per session.

The tiny model (engine.testing.make_tiny_checkpoint, seed 0) produces junk, but real tokens: greedy
decoding from it tends to repeat one token, which makes long generations (cancellation tests) and
non-empty single-line suggestions deterministic.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from engine.testing import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"), seed=0))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model):
    from engine.tokenizer import Tokenizer

    return Tokenizer.from_dir(tiny_model)
