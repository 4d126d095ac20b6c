import json

import pytest

from kernel_gym.models import BUILTIN_MODELS, ModelSpec, load_model


def test_builtin_specs_match_design():
    m = load_model("mixtral-8x7b")
    assert (m.num_experts, m.top_k, m.hidden, m.intermediate, m.num_kv_heads) == (8, 2, 4096, 14336, 8)
    o = load_model("olmoe-1b-7b")
    assert (o.num_experts, o.top_k, o.hidden, o.intermediate, o.num_layers) == (64, 8, 2048, 1024, 16)
    # Mixtral-8x7B has about 46.7 B parameters: the weight estimate must be in that range.
    assert 85e9 < m.weight_bytes < 100e9


def test_spec_from_file_and_errors(tmp_path):
    data = {k: v for k, v in BUILTIN_MODELS["olmoe-1b-7b"].__dict__.items()}
    data["name"] = "mine"
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    assert load_model(str(path)).name == "mine"
    data.pop("top_k")
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="missing fields.*top_k"):
        load_model(str(path))
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        load_model("nope")


def test_spec_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelSpec("x", 1, 64, 6, 4, 16, 4, 2, 32)
    with pytest.raises(ValueError, match="top_k"):
        ModelSpec("x", 1, 64, 4, 4, 16, 4, 8, 32)
