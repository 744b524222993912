"""kog-lsp serving a Laneformer lane checkpoint: `--model <lane dir> --tp-mode delayed` (tp=1 here: the reference
backend simulates both lanes on the CPU) loads it with its tokenizer, reports tp_mode 'delayed', and answers an
inline completion; `--tp-mode exact` on the same directory fails to load with the mode refusal in the status.

On two Hopper GPUs the same test runs the tensor-parallel delayed kernel with
KOG_LANE_SERVER_ARGS="--device cuda --tp 2" (and then expects the monokernel backend)."""

from __future__ import annotations

import os
import shlex

import pytest
from lsprotocol import types

from lsp_clients import VSCODE, field, inline_params, open_doc, start_client, stats, wait_status

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXTRA = shlex.split(os.environ.get("KOG_LANE_SERVER_ARGS", ""))
TP = int(EXTRA[EXTRA.index("--tp") + 1]) if "--tp" in EXTRA else 1


@pytest.fixture(scope="module")
def lane_dir(tmp_path_factory) -> str:
    from engine.testing_lanes import make_tiny_lane_checkpoint
    # on the kernel: a shape it runs (head_dim 64, tests/gpu/shapes.py's small Llama sizes)
    shape = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1536,
                 vocab_size=4096) if TP > 1 else {}
    return str(make_tiny_lane_checkpoint(tmp_path_factory.mktemp("lane-model"), seed=4, tokenizer=True,
                                         broadcast_delay=2, **shape))


async def test_lane_checkpoint_served_in_delayed_mode(lane_dir):
    c = await start_client(lane_dir, VSCODE, {"debounceMs": 0, "maxTokens": 8, "contextTokens": 64},
                           extra_args=["--tp-mode", "delayed", *EXTRA])
    try:
        st = await wait_status(c, {"ready", "error"}, timeout=120)
        assert field(st, "state") == "ready", st
        s = await stats(c)
        eng = s["engine"]
        assert eng["tp_mode"] == "delayed" and eng["tp"] == TP
        assert eng["backend"] == ("reference" if TP == 1 else "monokernel")
        uri = "file:///work/lane.py"
        open_doc(c, uri, "def main():\n    x = \n")
        res = await c.text_document_inline_completion_async(
            inline_params(uri, 1, 8, types.InlineCompletionTriggerKind.Invoked))
        # a random tiny model may well propose nothing; the request must be answered by a generation
        assert res is not None and isinstance(res.items, (list, tuple))
        assert (await stats(c))["generations"] >= 1
    finally:
        await c.shutdown_session()
        await c.stop()


async def test_lane_checkpoint_in_exact_mode_is_refused(lane_dir):
    c = await start_client(lane_dir, VSCODE, {"debounceMs": 0}, extra_args=["--tp-mode", "exact"])
    try:
        st = await wait_status(c, {"ready", "error"}, timeout=120)
        assert field(st, "state") == "error"
        assert "Use tp_mode='delayed'" in (field(st, "message") or ""), st
    finally:
        await c.shutdown_session()
        await c.stop()
