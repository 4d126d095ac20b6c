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
    shapes = {8: (2, 4096), 64: (8, 3584)}  # hidden and top_k do not enter the rules; any shape of that E will do
    for (dev, e, n, sel), table in vllm_tables.SHIPPED.items():
        assert dev == "NVIDIA_H200" and sel is None and tuple(sorted(table)) == vllm_tables.VLLM_M_KEYS
        top_k, hidden = shapes[e]
        for m, entry in vllm_tables.shipped_table(e, n, "NVIDIA H200").items():
            wl = MoEWorkload(m, e, top_k, hidden, n)
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


def test_default_rule_without_a_table():
    olmoe = MoEWorkload(64, 64, 8, 2048, 1024)  # vLLM ships no H200 table for OLMoE
    assert vllm_tables.shipped_table(64, 1024, "NVIDIA H200") is None
    assert FAMILY.default_config(olmoe) == cfg(bm=16, bn=32, bk=64, group=1, warps=4, stages=3)
    assert FAMILY.default_config(MoEWorkload(65, 64, 8, 2048, 1024)) == cfg(bm=64, bn=64, bk=32, group=8, stages=3)
    assert FAMILY.space.is_valid(FAMILY.default_config(olmoe), olmoe)
    # another GPU: vLLM has no H200 table there
    assert vm.vllm_engine_config(8, 14336, 1, device_name="NVIDIA A100-SXM4-80GB")["BLOCK_SIZE_N"] == 32


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
               MoEWorkload(64, 64, 8, 2048, 1024)):
        configs = [FAMILY.default_config(wl), *FAMILY.space.sample(wl, 6, seed=wl.num_tokens)]
        for c in configs:
            check(wl, c)
