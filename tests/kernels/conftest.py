import pytest

from kernels.testing import tiny_cfg, tiny_model


@pytest.fixture
def qwen_tiny():
    cfg = tiny_cfg()
    return cfg, tiny_model(cfg)
