"""Model specs: the few numbers of an MoE transformer that decide every kernel shape.

Two specs are built in (README.md, docs/architecture.md); users pass their own as a JSON file with the same fields.
Imports only the standard library: this module runs on the GPU machine too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """Shape-defining numbers of a Mixture-of-Experts decoder."""

    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    intermediate: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("int",) and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"model spec {self.name!r}: {field.name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model spec {self.name!r}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.top_k > self.num_experts:
            raise ValueError(f"model spec {self.name!r}: top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")

    @property
    def expert_weight_bytes(self) -> int:
        """Bytes of one expert's gate/up and down weights (3 matrices hidden x intermediate)."""
        return 3 * self.hidden * self.intermediate * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Approximate parameter bytes: attention projections plus all experts, per layer, times layers."""
        qkv = self.hidden * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        attn = qkv + self.num_heads * self.head_dim * self.hidden
        router = self.hidden * self.num_experts
        experts = self.num_experts * 3 * self.hidden * self.intermediate
        return self.num_layers * (attn + router + experts) * self.dtype_bytes


BUILTIN_MODELS: dict[str, ModelSpec] = {
    "mixtral-8x7b": ModelSpec(
        name="mixtral-8x7b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        num_experts=8, top_k=2, intermediate=14336,
    ),
    "olmoe-1b-7b": ModelSpec(
        name="olmoe-1b-7b", num_layers=16, hidden=2048, num_heads=16, num_kv_heads=16, head_dim=128,
        num_experts=64, top_k=8, intermediate=1024,
    ),
}


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in or zoo spec by name ("NAME@tpN": its tensor-parallel shard), or a spec from a JSON file with
    ModelSpec's fields."""
    if name_or_path in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path]
    from kernel_gym import zoo  # the zoo builds on this module

    base, _, tp = name_or_path.partition("@tp")
    if base in zoo.ZOO:
        if tp and not tp.isdigit():
            raise ValueError(f"model {name_or_path!r}: write a shard as NAME@tpN with N an integer, e.g. {base}@tp2")
        return zoo.shard(zoo.ZOO[base], int(tp or 1))
    path = Path(name_or_path)
    if not path.suffix == ".json" or not path.exists():
        raise ValueError(
            f"unknown model {name_or_path!r}: use one of {sorted(zoo.ZOO)} (NAME@tpN for a tensor-parallel shard) "
            "or the path of a JSON file with the fields of kernel_gym.models.ModelSpec"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); fix the file") from exc
    names = {f.name for f in dataclasses.fields(ModelSpec)}
    missing = names - set(data) - {"dtype_bytes"}
    unknown = set(data) - names
    if missing or unknown:
        raise ValueError(
            f"{path}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}; expected {sorted(names)}"
        )
    return ModelSpec(**data)
