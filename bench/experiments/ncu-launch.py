"""One Monokernel launch for Nsight Compute to profile (bench/experiments/ncu-source.sh): the shape's engine launch
(clusters where schedule.attn_cluster_model picks them) without the side launch (ncu serialises launches, so a side
launch would only wait and leave), ctx 512: a 32-token warm-up launch, then the profiled one of 64 tokens.
usage: ncu ... --kernel-name mk_decode --launch-skip 1 --launch-count 1 python3 bench/experiments/ncu-launch.py <shape>"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from bench.decode import random_setup
from kernels.runtime import Monokernel
from kernels.schedule import Dims, attn_cluster_model

name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b"
cfg, model, cache = random_setup(name, 512 + 128)
mk = Monokernel(model, cache.k, cache.v, max_steps=128, attn_cluster=attn_cluster_model(Dims.of(cfg)), side=False)
print("warm-up:", mk.run(0, 1234, 512, 32)[1])
torch.cuda.synchronize()
toks, why = mk.run(0, 1234, 512, 64)
print(f"profiled launch: {len(toks)} tokens ({why})")
