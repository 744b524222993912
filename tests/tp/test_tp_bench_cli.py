"""bench/tp.py without a GPU: argument parsing, a clear failure without CUDA, --plan-only output, the monokernel
hook rows saying why they did not run, and the peer's sharded decode step checked on CPU (2 gloo processes)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "tp.py"


@pytest.fixture(scope="module")
def tp_bench():
    spec = importlib.util.spec_from_file_location("bench_tp", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_and_bad_args(tp_bench, capsys):
    with pytest.raises(SystemExit) as e:
        tp_bench.parse_args(["--help"])
    assert e.value.code == 0 and "--gpus" in capsys.readouterr().out
    for bad in (["--shape", "gpt-9"], ["--gpus", "0"], ["--tokens", "0"]):
        with pytest.raises(SystemExit) as e:
            tp_bench.parse_args(bad)
        assert e.value.code == 2
    args, shapes = tp_bench.parse_args(["--shape", "all", "--gpus", "4"])
    assert shapes == list(tp_bench.SHAPES) and args.gpus == 4 and args.ctx == 512 and args.tokens == 256


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_cli_fails_clearly_without_cuda():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, str(BENCH), "--gpus", "2"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 2
    assert "needs CUDA GPUs" in p.stderr and "--plan-only" in p.stderr


def test_plan_only_table_then_json(tp_bench, capsys):
    assert tp_bench.main(["--plan-only", "--gpus", "2", "--shape", "qwen-1.5b,llama-1b"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    last = json.loads(lines[-1])
    assert last["bench"] == "tp" and [(r["shape"], r["gpus"]) for r in last["rows"]] == \
        [("qwen-1.5b", 1), ("qwen-1.5b", 2), ("llama-1b", 1), ("llama-1b", 2)]
    q1, q2 = last["rows"][0], last["rows"][1]
    assert abs(q1["weights_GB_per_gpu"] - 3.09) < 0.01            # shared/GPU.md: 3.09 GB per token
    assert q2["weights_GB_per_gpu"] < 0.51 * q1["weights_GB_per_gpu"]
    assert any(line.startswith("qwen-1.5b") for line in lines[:-1])


def test_monokernel_rows_say_why_not_run(tp_bench):
    args, _ = tp_bench.parse_args(["--gpus", "2"])
    cfg = tp_bench.SHAPES["qwen-1.5b"]()
    for name in tp_bench.MONOKERNEL_ROWS:
        row = tp_bench.backend_row(name, cfg, args)
        if torch.cuda.is_available():
            continue
        assert "us" not in row and row["not_run"], row
    assert tp_bench.backend_row("monokernel-delayed", tp_bench.SHAPES["dense-2b"](), args)["not_run"]


def test_table_rows_never_invent_numbers(tp_bench):
    args, _ = tp_bench.parse_args(["--gpus", "2"])
    cfg = tp_bench.SHAPES["qwen-0.5b"]()
    peer = {"peer_1gpu_us": 400.0, "peer_2gpu_us": 500.0, "peer_2gpu_comm_cost_us": 300.0}
    mk = [{"backend": "monokernel-1gpu", "gpus": 1, "us": 250.0},
          {"backend": "monokernel-exact", "gpus": 2, "not_run": "not built"}]
    rows = tp_bench.table_rows("qwen-0.5b", cfg, peer, mk, 2, 4.25e12, args)
    by = {(r["backend"], r["gpus"]): r for r in rows}
    assert by[("peer (NCCL + CUDA graph)", 2)]["speedup_vs_1gpu"] == pytest.approx(0.8)
    assert "us" not in by[("monokernel-exact", 2)] and "speedup_vs_1gpu" not in by[("monokernel-exact", 2)]
    tp_bench.print_table(rows)


GLOO_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import tp
configs = {
    "tiny-qwen": dict(arch="qwen2", vocab_size=101, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      intermediate_size=100, head_dim=16, qkv_bias=True, tie_word_embeddings=True),
    "tiny-straddle": dict(arch="llama", vocab_size=90, hidden_size=96, n_layers=2, n_heads=6, n_kv_heads=3,
                          intermediate_size=98, head_dim=16, tie_word_embeddings=False),
}
spec = {"device": "cpu", "dtype": "fp32", "ctx": 7, "tokens": 4, "warmup": 2, "reps": 1, "configs": configs,
        "return_logits": True}
print(json.dumps(tp.run_peer(list(configs), 2, spec)))
"""


def test_peer_step_sharded_equals_unsharded_on_cpu():
    """The benchmark's own decode step, 2 ranks over gloo in fp32, against the same step on 1 rank: the peer
    really computes the model (incl. a straddling head split and uneven vocab / ffn shards)."""
    p = subprocess.run([sys.executable, "-c", GLOO_SCRIPT, str(BENCH.parent)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    assert [r["shape"] for r in rows] == ["tiny-qwen", "tiny-straddle"]
    for r in rows:
        assert "error" not in r, r
        assert r["check_rel_l2_vs_1gpu"] < 1e-5 and r["check_token_equal"], r
        torch.testing.assert_close(torch.tensor(r["logits"]), torch.tensor(r["ref_logits"]), atol=1e-5, rtol=1e-5)
    assert "balanced" in rows[1]["plan"]


def test_time_kernel_run_restores_before_each_run_and_reports_the_median(tp_bench):
    """The monokernel rows' timing: one warm-up run, then reps timed runs of `tokens`, each after restore(); the
    result is the median time per generated token in microseconds."""
    from types import SimpleNamespace
    calls = []

    class FakeKernel:
        def run(self, slot, tok, pos, n):
            calls.append(("run", tok, pos, n))
            return [tok] * n, "length"

    args = SimpleNamespace(warmup=4, reps=3, ctx=100, tokens=8)
    us = tp_bench.time_kernel_run(FakeKernel(), lambda: calls.append(("restore",)), args, 7)
    assert calls == [("restore",), ("run", 7, 100, 4)] + [("restore",), ("run", 7, 100, 8)] * 3
    assert 0 < us < 1e5
