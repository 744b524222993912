"""Build the monokernel shared library with plain nvcc (no torch headers: seconds, not a minute).

The library is cached under ~/.cache/kog-lsp/kernels/<hash>/ keyed by the sources, the rendered ISA header and
the flags; a build prints one progress line. `KOG_KERNELS_CACHE` overrides the cache root. The variants: one GPU
with the tensor-parallel exchange compiled out (-DMK_TP=0), with or without cluster=True (-DMK_CLUSTER=1: the
attention combined inside thread-block clusters, Monokernel(attn_cluster=...)), and tp=True (kernels/tp_runtime.py).
A cluster build with kv_overlap=True (-DMK_KV_OVERLAP=1) restages the attention's later K / V chunks while the loop
runs: the library Monokernel launches when a launch's longest split needs more than one staged chunk.
Each is built for one attention head size (head_dim in isa.HEAD_DIMS: -DMK_HEAD_DIM), so the kernel holds one
attention path (a smaller kernel).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import isa

CSRC = Path(__file__).parent / "csrc"
# Every CUDA source beside monokernel.cu (one translation unit); mk_isa.h is rendered from isa.py instead.
SOURCES = tuple(sorted(p.name for p in CSRC.glob("*") if p.suffix in (".cu", ".cuh", ".h") and p.name != "mk_isa.h"))
ARCH = "-gencode=arch=compute_90a,code=sm_90a"
FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-shared", "-lineinfo", "-Xptxas", "-v")
# One-GPU builds: ptxas keeps the constants it makes out of the constant bank. Session 18 measured it at -1.5 / -0.5
# / -4.5 us per token on 0.5B / Llama / 1.5B in both rounds and at both contexts (bench/experiments/flags-sweep.sh,
# bench/NOTES.md); the tensor-parallel build keeps the default until it is measured on several GPUs.
ONE_GPU_FLAGS = ("-Xptxas", "--disable-optimizer-constants")


def cache_root() -> Path:
    return Path(os.environ.get("KOG_KERNELS_CACHE", Path.home() / ".cache" / "kog-lsp" / "kernels"))


def find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    return None


def extra_flags() -> tuple[str, ...]:
    """KOG_NVCC_FLAGS: further nvcc flags, space-separated (compiler experiments: bench/experiments/flags-sweep.sh);
    part of the cache key, so each set of flags gets its own build."""
    return tuple(os.environ.get("KOG_NVCC_FLAGS", "").split())


def variant_flags(tp: bool, cluster: bool = False, *, head_dim: int, kv_overlap: bool = False) -> tuple[str, ...]:
    if tp and cluster:
        raise ValueError("the tensor-parallel build has no cluster attention")
    if kv_overlap and not cluster:
        raise ValueError("kv_overlap: a cluster build only")
    if head_dim not in isa.HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim}: the kernel has attention for {', '.join(map(str, isa.HEAD_DIMS))}")
    return (f"-DMK_TP={int(tp)}", f"-DMK_CLUSTER={int(cluster)}", f"-DMK_HEAD_DIM={head_dim}") + \
        (() if tp else ONE_GPU_FLAGS) + (("-DMK_KV_OVERLAP=1",) if kv_overlap else ())


def nvcc_flags(tp: bool, cluster: bool, *, head_dim: int, extra: tuple[str, ...],
               kv_overlap: bool = False) -> tuple[str, ...]:
    """Every nvcc flag of the variant's build, extra (extra_flags()) last: what the cache key hashes and nvcc gets."""
    return (ARCH,) + FLAGS + variant_flags(tp, cluster, head_dim=head_dim, kv_overlap=kv_overlap) + extra


def source_hash(tp: bool = False, cluster: bool = False, *, head_dim: int,
                extra: tuple[str, ...] | None = None, kv_overlap: bool = False) -> str:
    """The variant's cache key; extra: the extra nvcc flags (None: read KOG_NVCC_FLAGS now)."""
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(isa.render_header().encode())
    flags = nvcc_flags(tp, cluster, head_dim=head_dim, extra=extra_flags() if extra is None else extra,
                       kv_overlap=kv_overlap)
    h.update(" ".join(flags).encode())
    return h.hexdigest()[:16]


def build(verbose: bool = False, tp: bool = False, cluster: bool = False, *,
          head_dim: int, kv_overlap: bool = False) -> Path:
    """-> path of libmonokernel.so of the variant (built if the cache has none for these sources)."""
    extra = extra_flags()   # one read: the cache key and the command line agree
    out_dir = cache_root() / source_hash(tp, cluster, head_dim=head_dim, extra=extra, kv_overlap=kv_overlap)
    lib = out_dir / "libmonokernel.so"
    if lib.exists():
        return lib
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (set NVCC or put it on PATH) and no cached monokernel build exists")
    out_dir.mkdir(parents=True, exist_ok=True)
    # The rendered header goes next to the build and comes first on the include path, so the ISA used is
    # always the one kernels/isa.py describes (tests check the checked-in copy matches too).
    (out_dir / "mk_isa.h").write_text(isa.render_header())
    tmp = out_dir / f"libmonokernel.{os.getpid()}.so"
    cmd = [nvcc, *nvcc_flags(tp, cluster, head_dim=head_dim, extra=extra, kv_overlap=kv_overlap), f"-I{out_dir}",
           f"-I{CSRC}", "-o", str(tmp), str(CSRC / "monokernel.cu")]
    what = ("tensor-parallel monokernel" if tp else "monokernel") + \
        (" with cluster attention" if cluster else "") + (" and K / V restaging overlap" if kv_overlap else "") + \
        f" for head_dim {head_dim}"
    flags_note = f" (extra flags: {' '.join(extra)})" if extra else ""
    print(f"[kernels] building {what} with nvcc into {out_dir}{flags_note} ...", file=sys.stderr, flush=True)
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True)
    (out_dir / "build.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed ({res.returncode}):\n{res.stderr[-4000:]}")
    if "spill" in res.stderr and " 0 bytes spill stores" not in res.stderr:
        print("[kernels] warning: ptxas reports register spills (see build.log)", file=sys.stderr)
    os.replace(tmp, lib)
    print(f"[kernels] built in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    if verbose:
        print(res.stderr, file=sys.stderr)
    return lib


if __name__ == "__main__":   # the builds the bench shapes use (head_dim 64: 0.5B, Llama-1B; 128: 1.5B)
    print(build(verbose=True, head_dim=64))
    print(build(verbose=True, head_dim=128))
    print(build(verbose=True, tp=True, head_dim=128))
    for hd in (64, 128):
        print(build(verbose=True, cluster=True, head_dim=hd))
        print(build(verbose=True, cluster=True, head_dim=hd, kv_overlap=True))
