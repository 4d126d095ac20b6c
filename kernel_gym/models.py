"""Model specs: the few numbers of an MoE transformer that decide every kernel shape.

Two specs are built in (README.md, docs/architecture.md); users pass their own as a JSON file with the same fields.
Imports only the standard library and (lazily, for a zoo name) zoo.py: this module runs on the GPU machine too.

Every field is checked as data (integers that are not booleans, within bounds no real model exceeds; dtype_bytes 1, 2
or 4), so an absurd spec (10^9 experts) fails in one line instead of allocating grids of that size.

Shared experts and latent attention (DeepSeek-style MLA) are accepted and recorded (`num_shared_experts`,
`shared_intermediate`, `attention`, `kv_lora_rank`, `rope_head_dim`) and count in `weight_bytes` and
`kv_bytes_per_token`, but the kernels do not model them: fused_moe times the routed experts only (a shared expert is
a dense MLP every token passes, outside the grouped GEMM, priced at its roofline time like the other untuned ops),
and the paged decode / prefill kernels are GQA attention over num_kv_heads x head_dim (MLA's compressed KV of
kv_lora_rank + rope_head_dim per token and its absorbed projections are not what they compute). A spec with
`attention: "mla"` therefore tunes the GQA kernels on the head shape it states, which is an approximation to say
aloud, not a measurement of MLA (docs/integrity.md).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kernel_gym.kernels.workloads import padded_head_dim

# ModelSpec and friends live in modelspec.py (re-exported here: every caller imports them from kernel_gym.models)
from kernel_gym.modelspec import (
    BUILTIN_MODELS,
    MIXERS,
    OPTIONAL_ZERO,
    SPEC_LIMITS,
    ModelSpec,
    is_hf_config,
    spec_from_dict,
    spec_from_hf_config,
)

__all__ = ["BUILTIN_MODELS", "OPTIONAL_ZERO", "SPEC_LIMITS", "ModelSpec", "kernel_spec", "load_model", "spec_caveats",
           "spec_from_dict"]


def spec_caveats(spec: ModelSpec) -> list[str]:
    """What a spec states that the kernels' tables do not model (module docstring), one line each, for the commands
    that tune or export for it to say aloud instead of silently tuning an approximation."""
    out = []
    if spec.attention == "mla":
        out.append(f"{spec.name} uses latent attention (MLA): the attention configs are chosen for GQA over "
                   f"{spec.num_kv_heads} KV heads x {spec.head_dim}, not for MLA's compressed KV "
                   "(an approximation: docs/integrity.md)")
    if spec.dtype_bytes != 2:
        kind = "fp8" if spec.dtype_bytes == 1 else "fp32"
        out.append(f"{spec.name} has {kind} weights (dtype_bytes {spec.dtype_bytes}): the kernels and their "
                   "measurements are bf16, so the configs are bf16 ones, not tuned for the engine's "
                   f"{kind} kernels")
    padded = padded_head_dim(spec.head_dim)
    if padded != spec.head_dim:
        out.append(f"{spec.name}'s head_dim {spec.head_dim} is not a power of two: kernel_gym's attention kernels "
                   + (f"run it only zero-padded to {padded}, so replay and plan price the padded model (attention "
                      f"and KV cache at head_dim {padded}: kernel_spec) and exports leave its attention tables out"
                      if padded else "cannot run it (above 256), so exports leave its attention tables out"))
    from kernel_gym.zoo import NO_DECODE, base_model

    if spec.attention != "mla" and base_model(spec.name) in NO_DECODE:  # the zoo spec keeps GQA numbers for it
        out.append(f"{spec.name}'s attention (latent or mixture-of-heads) is not what the paged decode kernel "
                   "computes (zoo.NO_DECODE): its attention configs are chosen for a GQA stand-in of the same heads")
    if spec.expert_quant:
        out.append(f"{spec.name}'s experts are {spec.expert_quant}-quantized: kernel_gym's kernels and measurements "
                   "are bf16, so its configs and prices are those of a bf16 deployment, and no engine config file is "
                   "written for the quantized experts")
    if spec.num_shared_experts:
        out.append(f"{spec.name}'s {spec.num_shared_experts} shared expert(s) run as a dense MLP outside the fused-MoE "
                   "kernel: priced at their roofline time, not tuned here")
    if spec.window_tokens:
        out.append(f"{spec.n_mixer_layers} of {spec.name}'s {spec.num_layers} layers run {MIXERS[spec.mixer]} over "
                   f"{spec.window_tokens} tokens: priced with the attention kernels over the keys each query sees, "
                   "their KV held from each window's start, in vLLM's shared pool or SGLang's window pool")
    elif spec.n_attention_layers < spec.num_layers:
        state = (f"their state ({spec.mixer_state_bytes / 2**20:.1f} MiB per request) is held in the KV pool and read "
                 "each step, their mixer kernels are not priced" if spec.mixer_state_bytes else
                 "their mixer kernels and state are not priced")
        kind = MIXERS[spec.mixer] if spec.mixer else "Mamba, linear or sliding-window attention"
        out.append(f"{spec.num_layers - spec.n_attention_layers} of {spec.name}'s {spec.num_layers} layers have no "
                   f"softmax attention ({kind}): {state} (the attention projections stand in for theirs)")
    if spec.n_dense_layers:
        out.append(f"{spec.name}'s {spec.n_dense_layers} dense-MLP layers (width {spec.dense_intermediate}) are priced "
                   "at their roofline time: not tuned here")
    return out


def kernel_spec(spec: ModelSpec) -> ModelSpec:
    """The model as kernel_gym's kernels run it: a head_dim that is not a power of two zero-padded to the next one
    (workloads.padded_head_dim), KV cache included, as an integration that pads q, k and v stores it. The simulators
    price this spec; spec_caveats says so."""
    padded = padded_head_dim(spec.head_dim)
    return dataclasses.replace(spec, head_dim=padded) if padded and padded != spec.head_dim else spec


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in or zoo spec by name, or a spec from a JSON file: ModelSpec's fields, or a Hugging Face config.json
    (spec_from_hf_config); "NAME@tpN" or "PATH.json@tpN": its tensor-parallel shard (what one GPU runs)."""
    if name_or_path in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path]
    from kernel_gym import zoo  # lazily: the zoo's table is only needed for a name that is not built in

    base, _, tp = name_or_path.partition("@tp")
    if base in zoo.ZOO:
        if tp and not tp.isdigit():
            raise ValueError(f"model {name_or_path!r}: write a shard as NAME@tpN with N an integer, e.g. {base}@tp2")
        return zoo.shard(zoo.ZOO[base], int(tp or 1))
    if tp and base.endswith(".json"):  # a user's spec at a TP degree, as a zoo name's: PATH.json@tpN
        if not tp.isdigit() or int(tp) < 1:
            raise ValueError(f"model {name_or_path!r}: write a shard as PATH.json@tpN with N an integer >= 1, e.g. "
                             f"{base}@tp2")
        return zoo.shard(load_model(base), int(tp))
    path = Path(name_or_path)
    if path.suffix == ".json" and not path.exists():
        raise ValueError(f"model spec file {name_or_path!r} does not exist: give the path of a JSON file with the "
                         "fields of kernel_gym.models.ModelSpec (docs/example_spec.json is one), or a model name")
    if not path.suffix == ".json" or not path.exists():
        raise ValueError(
            f"unknown model {name_or_path!r}: use one of {sorted(zoo.ZOO)} or the path of a JSON file with the fields "
            "of kernel_gym.models.ModelSpec (NAME@tpN or PATH.json@tpN for a tensor-parallel shard)"
        )
    if path.stat().st_size > 1 << 20:
        raise ValueError(f"{path}: {path.stat().st_size} bytes is not a model spec (a few fields of JSON)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); fix the file") from exc
    if is_hf_config(data):  # a Hugging Face config.json, named after its folder (or file, if not config.json)
        hf_name = str(data.get("_name_or_path") or "").rstrip("/").split("/")[-1] \
            or (path.resolve().parent.name if path.name == "config.json" else path.stem)
        return spec_from_hf_config(data, str(path), hf_name)
    return spec_from_dict(data, str(path))
