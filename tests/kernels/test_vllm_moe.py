"""vllm_fused_moe: vLLM's design (alignment, grouped GEMM, silu-and-mul, top-k sum) vs the fused_moe reference (CPU
interpreter: fp32/fp16; GPU: bf16), its knob space against vLLM's shipped tables, and vLLM's lookup rules."""

from __future__ import annotations

import pytest
import torch

from kernel_gym.kernels import get_family, vllm_tables
from kernel_gym.kernels import vllm_moe as vm
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import MoEWorkload

FAMILY = vm.FAMILY
HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def cfg(bm=16, bn=64, bk=32, group=1, warps=4, stages=2) -> Config:
    return Config(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=group, num_warps=warps,
                  num_stages=stages)


def check(wl: MoEWorkload, config: Config, seed: int = 0) -> None:
    inputs = FAMILY.make_inputs(wl, DEVICE, seed)
    ref = FAMILY.reference(inputs)
    out = FAMILY.prepare(inputs, config)()
    assert out.shape == (wl.num_tokens, wl.hidden) and out.dtype == inputs.x.dtype
    atol, rtol = FAMILY.tolerance(wl.dtype)
    err = (out.float() - ref).abs().max().item()
    assert torch.allclose(out.float(), ref, atol=atol, rtol=rtol), f"{config} on {wl}: max abs error {err:.3e}"


def test_registered_with_the_fused_moe_workload_type():
    assert get_family("vllm_fused_moe") is FAMILY
    assert FAMILY.workload_type is get_family("fused_moe").workload_type


def test_align_pads_each_expert_segment_without_host_sizes():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2], [1, 3]], dtype=torch.int32)  # expert 3: 5 slots; 4, 5 empty
    al = vm.moe_align_block_size(ids, num_experts=6, block_m=4)
    n = ids.numel()
    assert al.sorted_token_ids.numel() == vm.max_padded_slots(n, 6, 4) == min(n + 6 * 3, n * 4)
    post = int(al.num_tokens_post_padded.item())
    assert post == 5 * 4  # experts 0, 1, 2 one block each, expert 3 two blocks
    sorted_ids = al.sorted_token_ids.long()
    assert (sorted_ids[post:] == n).all()
    real = sorted_ids[sorted_ids < n]
    assert sorted(real.tolist()) == list(range(n))
    assert al.expert_ids[:5].tolist() == [0, 1, 2, 3, 3]
    flat = ids.flatten().long()
    for block, expert in enumerate(al.expert_ids[:5].tolist()):
        rows = sorted_ids[block * 4:(block + 1) * 4]
        assert (flat[rows[rows < n]] == expert).all()
    assert int(al.expert_ids.max()) <= 5  # blocks past the end are clamped to a real expert (never read)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("wl_args", [(1, 4, 2, 64, 96, 0.0), (5, 4, 2, 64, 96, 0.0), (33, 4, 2, 64, 96, 1.2),
                                     (7, 8, 3, 48, 40, 0.6)])
def test_matches_reference_under_interpreter(dtype, wl_args):
    wl = MoEWorkload(*wl_args, dtype=dtype)
    # uneven K (96 % 64, 48 % 32), BLOCK_SIZE_K beyond K, several GROUP_SIZE_M swizzles, the default config
    for c in (FAMILY.default_config(wl), cfg(), cfg(bm=32, bn=128, bk=64, group=16, stages=3),
              cfg(bm=16, bn=32, bk=256, group=64, warps=8, stages=2)):
        check(wl, c)


def test_same_result_for_every_block_m_and_workspaces_start_nan():
    wl = MoEWorkload(9, 4, 2, 64, 32, 0.3, "float32")
    inputs = FAMILY.make_inputs(wl, DEVICE, 1)
    outs = [FAMILY.prepare(inputs, cfg(bm=bm))().clone() for bm in (16, 32, 64)]
    assert all(torch.allclose(outs[0], o, atol=1e-5) for o in outs[1:])


def test_every_shipped_h200_entry_is_valid_and_the_lookup_is_vllms():
    # hidden and top_k do not enter the rules; any shape of that E will do
    assert len(vllm_tables.SHIPPED) == 22  # every bf16 E=*,N=*,device_name=NVIDIA_H200.json of vLLM 0.33.0
    for (dev, e, n, sel), table in vllm_tables.SHIPPED.items():
        assert dev == "NVIDIA_H200" and sel is None and tuple(sorted(table)) == vllm_tables.VLLM_M_KEYS
        for m, entry in vllm_tables.shipped_table(e, n, "NVIDIA H200").items():
            wl = MoEWorkload(m, e, 2, 2048, n)
            c = vm.to_config(entry)
            assert FAMILY.space.why_invalid(c, wl) is None, (e, n, m, entry)
            assert vm.to_entry(c) == entry and list(vm.to_entry(c)) == list(vllm_tables.CONFIG_KEYS)
    # nearest key, ties to the smaller key; beyond the last key the last entry
    table = vllm_tables.shipped_table(8, 14336, "NVIDIA H200")
    assert vllm_tables.nearest_key(table, 20) == 16 and vllm_tables.nearest_key(table, 21) == 24
    assert vllm_tables.nearest_key(table, 100000) == 4096
    assert vm.vllm_engine_config(8, 14336, 100) == vm.to_config(table[96])
    # H200 variants fold to NVIDIA_H200 in vLLM's naming
    assert vm.vllm_engine_config(8, 14336, 1, device_name="NVIDIA H200 NVL") == vm.to_config(table[1])
    # tables vLLM 0.33 ships that older releases lacked (issue 24)
    for e, n in ((512, 64), (512, 512), (128, 96), (128, 1024), (16, 1024), (16, 2048)):
        assert vllm_tables.shipped_table(e, n, "NVIDIA H200") is not None, (e, n)


def test_every_sglang_shipped_entry_is_valid_and_its_folder_search():
    for t in vllm_tables.engine_data("sglang-0.5.23")["tables"]:
        for m, entry in t["entries"].items():
            c = vm.to_config(vllm_tables._entry(entry))
            assert FAMILY.space.why_invalid(c, MoEWorkload(int(m), t["E"], 2, 2048, t["N"])) is None, (t["file"], m)
    # Mixtral: no file for Triton 3.8.0; SGLang falls back to the newest folder that has one (triton_3_1_0 here)
    table, where = vllm_tables.shipped_lookup(8, 14336, "NVIDIA H200", engine="sglang-0.5.23")
    assert where["folder"] == "triton_3_1_0" and where["fallback"] and table[1]["BLOCK_SIZE_M"] == 16
    # E=512, N=128 exists in triton_3_5_1 and triton_3_4_0: newest first
    assert vllm_tables.shipped_lookup(512, 128, "NVIDIA H200", engine="sglang")[1]["folder"] == "triton_3_5_1"
    # its own Triton's folder first when it has the file
    assert vllm_tables.shipped_lookup(512, 128, "NVIDIA H200", engine="sglang",
                                      triton_version="3.4.0")[1]["folder"] == "triton_3_4_0"
    # SGLang does not fold H200 variants
    assert vllm_tables.shipped_table(8, 14336, "NVIDIA H200 NVL", engine="sglang") is None
    assert vllm_tables.sglang_triton_version("sglang-0.5.23") == "3.8.0"
    assert vllm_tables.triton_folder("3.8.0") == "triton_3_8_0"
    with pytest.raises(ValueError, match="X.Y.Z"):
        vllm_tables.triton_folder("3.8")
    with pytest.raises(ValueError, match="no tables of vllm-0.1.0"):
        vllm_tables.parse_engine("vllm==0.1.0")


def test_default_rules_without_a_table():
    olmoe = MoEWorkload(64, 64, 8, 2048, 1024)  # vLLM ships no H200 table for OLMoE
    assert vllm_tables.shipped_table(64, 1024, "NVIDIA H200") is None
    # vLLM 0.33.0's get_default_config (bf16, CUDA)
    assert FAMILY.default_config(olmoe) == cfg(bm=32, bn=64, bk=128, group=1, warps=4, stages=3)
    assert FAMILY.default_config(MoEWorkload(8, 64, 8, 2048, 1024)) == cfg(bm=16, bn=64, bk=128, stages=4)
    assert FAMILY.default_config(MoEWorkload(4096, 64, 8, 2048, 1024)) == cfg(bm=128, bn=128, bk=64, group=1,
                                                                              warps=8, stages=3)
    assert vllm_tables.default_entry(4096, 16)["GROUP_SIZE_M"] == 16  # 4096 // 16 tokens per expert > 128
    assert vllm_tables.default_entry(200, 64) == {**vm.to_entry(cfg(bm=64, bn=128, bk=64, warps=8, stages=3))}
    # SGLang 0.5.23 (and vLLM before 0.33): M <= E -> 16/32/64 GROUP 1, else 64/64/32 GROUP 8; 4 warps, 3 stages
    sg = "sglang-0.5.23"
    assert FAMILY.default_config(olmoe, engine=sg) == cfg(bm=16, bn=32, bk=64, group=1, warps=4, stages=3)
    assert FAMILY.default_config(MoEWorkload(65, 64, 8, 2048, 1024), engine=sg) == cfg(bm=64, bn=64, bk=32, group=8,
                                                                                        stages=3)
    for m in vllm_tables.VLLM_M_KEYS:
        for eng in ("vllm", sg):
            assert FAMILY.space.is_valid(FAMILY.default_config(MoEWorkload(m, 64, 8, 2048, 1024), engine=eng), olmoe)
    # another GPU: vLLM has no H200 table there
    assert vm.vllm_engine_config(8, 14336, 1, device_name="NVIDIA A100-SXM4-80GB")["BLOCK_SIZE_N"] == 64


def test_aligned_path_key_is_the_version_and_the_small_batch_path_has_its_own():
    """The stored H200 vllm_fused_moe rows are keyed by the family's version; the small-batch path's by its own key."""
    assert vm.store_key() == "v1"
    assert vm.small_batch_store_key() != vm.store_key()
    small, big = MoEWorkload(2, 64, 8, 2048, 1024), MoEWorkload(3, 64, 8, 2048, 1024)  # 2*8*4 = 64 <= 64 < 96
    assert vm.uses_small_batch_path(small) and not vm.uses_small_batch_path(big)
    assert not vm.uses_small_batch_path(small, engine="sglang-0.5.23")  # SGLang always aligns
    assert not vm.uses_small_batch_path(small, ep=2)  # an expert map turns it off
    assert vm.path_store_key(small) == vm.small_batch_store_key() and vm.path_store_key(big) == vm.store_key()
    assert vm.uses_small_batch_path(MoEWorkload(1, 8, 2, 4096, 14336))  # Mixtral at M = 1: 8 <= 8


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("wl_args", [(1, 16, 2, 64, 96, 0.0), (2, 16, 2, 64, 96, 1.2), (1, 8, 2, 48, 40, 0.0)])
def test_small_batch_path_matches_reference_under_interpreter(dtype, wl_args):
    wl = MoEWorkload(*wl_args, dtype=dtype)
    assert vm.uses_small_batch_path(wl)
    inputs = FAMILY.make_inputs(wl, DEVICE, 0)
    ref = FAMILY.reference(inputs)
    atol, rtol = FAMILY.tolerance(dtype)
    for c in (FAMILY.default_config(wl), cfg(bm=32, bn=128, bk=64, group=16, stages=3), cfg(bn=32, bk=256)):
        out = FAMILY.engine_prepare(inputs, c)()
        assert not torch.isnan(out).any() and torch.allclose(out.float(), ref, atol=atol, rtol=rtol), c
        assert torch.allclose(out, vm.prepare(inputs, c)(), atol=atol, rtol=rtol)  # the same numbers as aligned


def test_rules_reject_shared_memory_and_registers():
    wl = MoEWorkload(64, 8, 2, 4096, 14336)
    assert "shared memory" in FAMILY.space.why_invalid(cfg(bm=256, bn=256, bk=256, warps=8, stages=5), wl)
    assert "accumulators" in FAMILY.space.why_invalid(cfg(bm=256, bn=256, bk=32, warps=8, stages=2), wl)
    nbrs = vm.neighbours(cfg(bm=16, bn=64, bk=64, group=1, stages=3), wl)
    assert nbrs and all(sum(a[k] != b for k, b in c.items()) == 1 for c in nbrs
                        for a in [cfg(bm=16, bn=64, bk=64, group=1, stages=3)])


@pytest.mark.gpu
def test_bf16_shipped_and_sampled_configs_on_gpu():
    for wl in (MoEWorkload(1, 8, 2, 4096, 14336), MoEWorkload(200, 8, 2, 4096, 14336, 1.2),
               MoEWorkload(64, 64, 8, 2048, 1024), MoEWorkload(2, 64, 8, 2048, 1024)):
        configs = [FAMILY.default_config(wl), *FAMILY.space.sample(wl, 6, seed=wl.num_tokens)]
        for c in configs:
            check(wl, c)
            if vm.uses_small_batch_path(wl):  # vLLM 0.33's small-batch path, bf16
                inputs = FAMILY.make_inputs(wl, DEVICE, 0)
                out = FAMILY.engine_prepare(inputs, c)()
                atol, rtol = FAMILY.tolerance(wl.dtype)
                assert torch.allclose(out.float(), FAMILY.reference(inputs), atol=atol, rtol=rtol), c


def test_kernels_only_aligns_once_and_gives_prepares_output():
    """prepare_kernels_only is prepare with the alignment done before the closure (the fused_moe timing scope):
    the same output, and calling it again reuses the one alignment."""
    wl = MoEWorkload(5, 4, 2, 64, 96, 0.6, "float32")
    inputs = FAMILY.make_inputs(wl, DEVICE, 0)
    c = cfg(bm=16, bn=32, bk=32)
    full, kernels_only = vm.prepare(inputs, c)(), vm.prepare_kernels_only(inputs, c)
    assert torch.equal(kernels_only(), full) and torch.equal(kernels_only(), full)
