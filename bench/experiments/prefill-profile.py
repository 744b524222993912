"""Where the graph prefill's time goes: torch.profiler over the eager static step (the ops the graph replays) and
over a graph replay, chunk 12 in bucket 32 over 1,024 cached positions, for each shape given (random weights).
usage: python3 bench/experiments/prefill-profile.py qwen2.5-coder-1.5b [qwen2.5-coder-0.5b ...]"""
import sys, time, torch
sys.path.insert(0, ".")
from torch.profiler import profile, ProfilerActivity
from engine.config import preset
from engine.kv_cache import KVCache
from kernels.testing import random_model
from engine.backends.graph import PrefillGraphs, static_step, bucket_for
for name in sys.argv[1:]:
    cfg = preset(name); dev = torch.device("cuda"); ML = 4096
    model = random_model(cfg, max_len=ML)
    cache = KVCache(1, cfg.n_layers, cfg.n_kv_heads, ML, cfg.head_dim, dtype=torch.bfloat16, device=dev)
    ids = torch.randint(0, cfg.vocab_size, (1100,), device=dev)
    model.forward(cache.k, cache.v, 0, ids[:1024], 0)
    pg = PrefillGraphs(model, cache); pg.warmup()
    chunk = ids[1024:1036]
    for _ in range(5): pg.prefill(0, chunk, 1024)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        a = time.perf_counter(); pg.prefill(0, chunk, 1024); torch.cuda.synchronize(); ts.append(time.perf_counter() - a)
    ts.sort(); print(f"{name}: graph prefill of 12 tokens: median {ts[10]*1e3:.3f} ms")
    # eager static step, same shapes as the bucket-32 graph
    b, w = 32, bucket_for(1024 + 32 - 1, ML)
    pg.ids[:12].copy_(chunk); pg.start.fill_(1024); pg.last.fill_(11)
    args = pg._args(0, b, w)
    for _ in range(3): static_step(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): static_step(*args)
        torch.cuda.synchronize()
    ka = prof.key_averages()
    tot = sum(e.device_time_total for e in ka) / 5
    cnt = sum(e.count for e in ka if e.device_time_total > 0) / 5
    print(f"{name}: eager static step (bucket {b}, window {w}): kernel time {tot/1e3:.3f} ms per step, {cnt:.0f} kernels per step")
    print(ka.table(sort_by="device_time_total", row_limit=22, max_name_column_width=70))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): pg.prefill(0, chunk, 1024)
        torch.cuda.synchronize()
    ka = prof.key_averages()
    tot = sum(e.device_time_total for e in ka) / 5
    cnt = sum(e.count for e in ka if e.device_time_total > 0) / 5
    print(f"{name}: graph replay: kernel time {tot/1e3:.3f} ms, {cnt:.0f} kernels per replay")
    del model, cache, pg; torch.cuda.empty_cache()
