"""The kernel library's build variants (kernels/build.py): with and without cluster attention for one GPU, one
tensor-parallel."""
import subprocess

import pytest

from kernels import build


def test_every_variant_has_its_own_cache_entry():
    keys = [(tp, cl, hd) for tp, cl in ((False, False), (True, False), (False, True))
            for hd in (64, 96, 128)]   # (tp, cluster attention, head size)
    assert len({build.source_hash(*k[:2], head_dim=k[2]) for k in keys}) == len(keys)
    assert build.source_hash(head_dim=64) == build.source_hash(False, False, head_dim=64)


def test_the_long_context_build_is_a_cluster_variant_with_its_own_cache_entry():
    """kv_overlap (the long-context library, runtime.Monokernel long_lib): -DMK_KV_OVERLAP=1 on a cluster build, its
    own cache key; the default builds do not carry the define; no plain or tensor-parallel variant of it."""
    for hd in (64, 128):
        flags = build.variant_flags(False, True, head_dim=hd, kv_overlap=True)
        assert "-DMK_KV_OVERLAP=1" in flags and "-DMK_CLUSTER=1" in flags
        assert not any("KV_OVERLAP" in f for f in build.variant_flags(False, True, head_dim=hd))
        assert build.source_hash(False, True, head_dim=hd, kv_overlap=True) != \
            build.source_hash(False, True, head_dim=hd)
    for tp in (False, True):
        with pytest.raises(ValueError, match="cluster build only"):
            build.variant_flags(tp, False, head_dim=64, kv_overlap=True)


def test_extra_nvcc_flags_get_their_own_cache_entry(monkeypatch):
    monkeypatch.delenv("KOG_NVCC_FLAGS", raising=False)
    plain = build.source_hash(head_dim=64)
    assert build.extra_flags() == ()
    monkeypatch.setenv("KOG_NVCC_FLAGS", " -Xptxas  -O2 ")
    assert build.extra_flags() == ("-Xptxas", "-O2")
    assert build.source_hash(head_dim=64) != plain
    monkeypatch.setenv("KOG_NVCC_FLAGS", "")
    assert build.source_hash(head_dim=64) == plain


def test_a_build_holds_one_attention_head_size():
    assert "-DMK_HEAD_DIM=64" in build.variant_flags(False, head_dim=64)
    assert "-DMK_HEAD_DIM=96" in build.variant_flags(True, head_dim=96)
    for hd in (0, 80):
        with pytest.raises(ValueError, match="64, 96, 128"):
            build.variant_flags(False, head_dim=hd)


def test_flags_name_the_variant_and_refuse_what_cannot_build():
    assert "-DMK_TP=1" in build.variant_flags(True, head_dim=64)
    assert "-DMK_TP=0" in build.variant_flags(False, head_dim=64)
    assert "-DMK_CLUSTER=1" in build.variant_flags(False, True, head_dim=64)
    assert "-DMK_CLUSTER=0" in build.variant_flags(False, head_dim=64)
    # the measured ptxas option: one-GPU builds only, and part of every cache key through these flags
    assert "--disable-optimizer-constants" in build.variant_flags(False, head_dim=128)
    assert "--disable-optimizer-constants" not in build.variant_flags(True, head_dim=128)
    with pytest.raises(ValueError, match="no cluster attention"):
        build.variant_flags(True, True, head_dim=64)


@pytest.mark.skipif(build.find_nvcc() is None, reason="needs nvcc (preprocessor only, no GPU)")
@pytest.mark.parametrize("tp,cl,hd,why", [(0, 0, 64, ""), (0, 0, 128, ""), (1, 0, 64, ""), (0, 1, 64, ""),
                                          (0, 1, 128, ""), (1, 1, 64, "no cluster attention"), (1, 0, 96, ""),
                                          (0, 0, 96, ""), (0, 0, 0, "MK_HEAD_DIM must be 64, 96 or 128"),
                                          (0, 0, 80, "MK_HEAD_DIM must be 64, 96 or 128")])
def test_the_source_refuses_what_the_tensor_parallel_build_cannot_hold(tmp_path, tp, cl, hd, why):
    from kernels import isa
    (tmp_path / "mk_isa.h").write_text(isa.render_header())
    res = subprocess.run([build.find_nvcc(), "-E", "-std=c++17", f"-DMK_TP={tp}", f"-DMK_CLUSTER={cl}",
                          f"-DMK_HEAD_DIM={hd}", f"-I{tmp_path}", f"-I{build.CSRC}",
                          str(build.CSRC / "monokernel.cu"), "-o", "/dev/null"], capture_output=True, text=True)
    assert (res.returncode == 0) == (not why), res.stderr[-2000:]
    if why:
        assert why in res.stderr
