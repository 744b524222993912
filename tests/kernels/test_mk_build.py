"""The kernel library's build variants (kernels/build.py): one per matvec loop for one GPU, one tensor-parallel."""
import subprocess

import pytest

from kernels import build


def test_every_variant_has_its_own_cache_entry():
    keys = [(False, False), (False, True), (True, False)]   # (tp, pipelined loop)
    assert len({build.source_hash(tp, pipe) for tp, pipe in keys}) == len(keys)
    assert build.source_hash() == build.source_hash(False, False)


def test_flags_name_the_loop_and_refuse_what_cannot_build():
    assert "-DMK_MV_PIPE=1" in build.variant_flags(False, True)
    assert "-DMK_MV_PIPE=0" in build.variant_flags(True)
    with pytest.raises(ValueError, match="one-set matvec loop only"):
        build.variant_flags(True, True)


@pytest.mark.skipif(build.find_nvcc() is None, reason="needs nvcc (preprocessor only, no GPU)")
@pytest.mark.parametrize("tp,pipe,ok", [(0, 0, True), (0, 1, True), (1, 0, True), (1, 1, False)])
def test_the_source_refuses_the_pipelined_loop_in_the_tensor_parallel_build(tmp_path, tp, pipe, ok):
    from kernels import isa
    (tmp_path / "mk_isa.h").write_text(isa.render_header())
    res = subprocess.run([build.find_nvcc(), "-E", "-std=c++17", f"-DMK_TP={tp}", f"-DMK_MV_PIPE={pipe}",
                          f"-I{tmp_path}", f"-I{build.CSRC}", str(build.CSRC / "monokernel.cu"), "-o", "/dev/null"],
                         capture_output=True, text=True)
    assert (res.returncode == 0) == ok, res.stderr[-2000:]
    if not ok:
        assert "one-set loop only" in res.stderr
