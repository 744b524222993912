"""Host time of Monokernel.launch (the call only: the kernel runs on after it returns) for three launch kinds the
engine makes (a decode loop with stop ids, a one-step launch with logits out, a two-step teacher-forced prefill),
median of 20 after a synchronize each, then cProfile of 20 decode-loop launches.
usage: python3 bench/experiments/launch-host-time.py [shape, default qwen2.5-coder-1.5b]"""
import cProfile, pstats, sys, time, io, torch
sys.path.insert(0, ".")
from bench.decode import random_setup
from kernels.runtime import Monokernel
from kernels.schedule import Dims, attn_cluster_model
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
cfg, model, cache = random_setup(name, 4096)
mk = Monokernel(model, cache.k, cache.v, max_steps=256, attn_cluster=attn_cluster_model(Dims.of(cfg)))
out = torch.empty(8, cfg.vocab_size, device="cuda")
def one(n, forced=None, logits=None, stop=()):
    torch.cuda.synchronize()
    a = time.perf_counter(); mk.launch(0, 5, 600, n, forced=forced, logits_out=logits, stop_ids=stop); b = time.perf_counter()
    mk.wait(); return (b - a) * 1e6
for kind, kw in [("decode 16 steps, 2 stop ids", dict(n=16, stop=(1, 2))), ("1 step, logits", dict(n=1, logits=out)),
                 ("2 forced steps, logits", dict(n=2, forced=[5, 6], logits=out))]:
    for _ in range(3): one(**kw)
    ts = sorted(one(**kw) for _ in range(20))
    print(f"{name} {kind}: host launch median {ts[10]:.1f} us (min {ts[0]:.1f})")
pr = cProfile.Profile()
for _ in range(20):
    torch.cuda.synchronize(); pr.enable(); mk.launch(0, 5, 600, 16, stop_ids=(1, 2)); pr.disable(); mk.wait()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14); print(s.getvalue()[:3500])
