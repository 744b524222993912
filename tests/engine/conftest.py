import pytest
import torch

from engine.testing import make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_qwen"), arch="qwen2", seed=1)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), arch="llama", seed=2,
                                tie_word_embeddings=False)

