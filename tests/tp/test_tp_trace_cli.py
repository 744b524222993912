"""bench/tp_trace.py without GPUs: bad arguments and too few GPUs end with exit status 2 and a message."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "tp_trace.py"


def run(*args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("args", [["--shape", "gpt-9"], ["--mode", "lazy"], ["--mode", ""]])
def test_bad_arguments(args):
    p = run(*args)
    assert p.returncode == 2 and "--shape one of" in p.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_too_few_gpus():
    p = run("--gpus", "4")
    assert p.returncode == 2 and "needs that many (>= 2) CUDA GPUs" in p.stderr and not p.stdout
