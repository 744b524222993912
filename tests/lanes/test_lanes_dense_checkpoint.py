"""The all-PRESENT lane model saved as an ordinary Llama directory (write_dense_llama_checkpoint)
loads in HF transformers and in this project's dense reference (engine.loader) with equal logits."""

import torch

from engine.lanes import write_dense_llama_checkpoint

SEQ = [3, 14, 15, 92, 65, 35, 89, 79]


def test_dense_checkpoint_matches_lanes_in_hf_and_engine(lane_model, tmp_path):
    m = lane_model(lanes=4, broadcast_delay=4, use_early_comm=True, seed=9)
    want = m(torch.tensor(SEQ))                                              # [S, V]
    d = write_dense_llama_checkpoint(m.cfg, m.w, tmp_path / "dense")

    from transformers import LlamaForCausalLM
    hf = LlamaForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    with torch.no_grad():
        got_hf = hf(torch.tensor([SEQ])).logits[0].float()
    torch.testing.assert_close(got_hf, want, atol=1e-4, rtol=1e-4)

    from engine.loader import load_model                                   # H1's dense reference
    dense = load_model(d, max_len=64)
    cfg = dense.cfg
    k = torch.zeros(1, cfg.n_layers, cfg.n_kv_heads, 64, cfg.head_dim)
    got = dense.forward(k, torch.zeros_like(k), 0, torch.tensor(SEQ), 0, all_logits=True)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
