"""kernel-gym plan beyond 1, 2, 4 and 8 GPUs and whole models: replicas on 3, 5, 6 or 7 GPUs (and fewer GPUs where
no deployment of all of them fits), shard names refused, config-file commands that write the listed files, the H200's
reported memory with each release's own share, and shared experts in the per-GPU weights."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest

from kernel_gym.cli.plan import main
from kernel_gym.models import load_model
from kernel_gym.parallel.deploy import MAX_MODEL_LEN, Deployment, kv_tokens_per_rank, why_invalid_deployment
from kernel_gym.parallel.layout import Layout, gpu_weight_bytes, why_invalid
from kernel_gym.traffic.simulator import H200_MEMORY_BYTES
from kernel_gym.zoo import ZOO
from tests.parallel.fixture_table import fixture_table

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL = load_model("mixtral-8x7b")
FAST = ["--trace", "bundled", "--window-s", "4", "--train-steps", "0", "--samples", "0", "--refine-rounds", "0",
        "--no-mlflow"]


@pytest.fixture(scope="module")
def backend():
    from kernel_gym.measure.coverage import cover
    from kernel_gym.measure.recorded import RecordedBackend

    return cover(RecordedBackend())


def plan_env(backend, model, gpus, engine="vllm"):
    from kernel_gym.envs.parallel_serving import ServingPlanEnv

    return ServingPlanEnv(backend=backend, model=model, trace="bundled", gpus=gpus, table=fixture_table(),
                          window_s=4.0, warmup_s=1.0, context_s=10.0, engine=engine)


# ---- 1. replicas count on any GPU count; fewer GPUs where none of all of them fits ---------------------------------

def test_plan_on_three_gpus_recommends_replicas(tmp_path, capsys):
    """Mixtral fits one GPU: 3 x TP1 serves it on 3 GPUs (TP3 and EP3 do not split it); was refused because the env
    checked single servers spanning all 3 GPUs only."""
    out = tmp_path / "plan.json"
    rc = main(["--model", "mixtral-8x7b", "--gpus", "3", *FAST, "--next", "1", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    best = json.loads(out.read_text())["recommended"]
    assert best["deployment"]["layout"] == "3xTP1" and best["deployment"]["gpus"] == 3
    assert [c.split()[0] for c in best["launch"]] == [f"CUDA_VISIBLE_DEVICES={i}" for i in range(3)]


def test_plan_env_counts_replicas_and_falls_back_to_fewer_gpus(backend):
    from kernel_gym.envs.parallel_serving import ParallelServingEnv

    for gpus in (3, 5, 6, 7):
        env = plan_env(backend, MIXTRAL, gpus)
        ok = [c for c, m in zip(env.choices, env._choice_mask) if m]
        assert env.used_gpus == gpus and (gpus, Layout(1, 1)) in ok, gpus
    with pytest.raises(ValueError, match="fits no layout on 3 GPUs"):  # ServingTPEP-v0: one server on all of them
        ParallelServingEnv(backend=backend, model=MIXTRAL, gpus=3, table=fixture_table())
    # Mixtral-8x22B needs 4 GPUs: nothing on 5 splits it, so the choices are those of 4 GPUs
    env = plan_env(backend, load_model("mixtral-8x22b"), 5)
    assert env.used_gpus == 4 and "TP5" in env.unfit_reasons
    assert {lay.name for (r, lay), m in zip(env.choices, env._choice_mask) if m} >= {"TP4", "EP4"}
    # a layout the collectives table has no rows for (a 3-GPU all-to-all) is masked, not priced into an error
    env = plan_env(backend, load_model("qwen1.5-moe-a2.7b"), 3)
    (why,) = [w for (r, lay), w in zip(env.choices, env.choice_reasons) if lay == Layout(1, 3)]
    assert "no all_to_all on 3 GPUs" in why and "run_collectives.py --gpus 3" in why
    assert "no all_to_all on 3 GPUs" in env._why(env.model, Deployment("vllm", 1, 1, 3, 64, 8192, 256, 512), 32768)


def test_plan_uses_fewer_gpus_where_none_of_all_of_them_fits(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["--model", "mixtral-8x22b", "--gpus", "5", *FAST, "--next", "0", "--json", str(out)]) == 0
    assert "the plan uses 4 of them" in capsys.readouterr().err
    assert json.loads(out.read_text())["recommended"]["deployment"]["gpus"] == 4


# ---- 2. a shard name is no model to plan --------------------------------------------------------------------------

def test_plan_refuses_a_shard_name(tmp_path, capsys):
    spec = tmp_path / "mine.json"
    spec.write_text((ROOT / "docs" / "example_spec.json").read_text())
    for model, whole in (("mixtral-8x7b@tp8", "--model mixtral-8x7b)"), (f"{spec}@tp2", f"--model {spec})")):
        assert main(["--model", model, "--gpus", "1", *FAST]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "plan chooses the parallelism itself" in line and line.endswith(whole), line
    shard = dict(json.loads(spec.read_text()), name="my-moe@tp2")  # a spec file that is a shard itself
    spec.write_text(json.dumps(shard))
    assert main(["--model", str(spec), "--gpus", "1", *FAST]) == 2
    assert "plan chooses the parallelism itself" in capsys.readouterr().err


# ---- 3. the printed commands write the listed files ---------------------------------------------------------------

def _flags(cmd: str) -> dict[str, str]:
    words = shlex.split(cmd.split(" (")[0].split(": ", 1)[-1])  # the command, not its "vLLM's own tuner: " label
    return {w: (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "")
            for i, w in enumerate(words) if w.startswith("--")}


def _written_shape(spec, cmd: str) -> tuple[int, int]:
    """(E, N) of the file the command writes: kernel-gym export through engine_export.shard_shape (what `export --tp
    --ep` runs); the engines' tuners by their own rules (vLLM benchmarks/kernels/benchmark_moe.py:
    --enable-expert-parallel gives E / tp-size experts at the whole N, else N / tp-size; SGLang
    tuning_fused_moe_triton.py: E / ep-size, N / (tp-size / ep-size))."""
    from kernel_gym.cli.export import build_parser
    from kernel_gym.deploy.engine_export import shard_shape

    f = _flags(cmd)
    if cmd.startswith("kernel-gym export"):
        args = build_parser().parse_args(shlex.split(cmd.split(" (")[0])[2:])
        s = shard_shape(spec, args.tp, ep=args.ep)
        return s.num_experts, s.n
    tp = int(f["--tp-size"])
    if "benchmark_moe.py" in cmd:
        return (spec.num_experts // tp, spec.intermediate) if "--enable-expert-parallel" in f else \
            (spec.num_experts, spec.intermediate // tp)
    ep = int(f["--ep-size"])
    return spec.num_experts // ep, spec.intermediate // (tp // ep)


@pytest.mark.parametrize("fp8", [False, True])
def test_config_file_commands_write_the_listed_files(fp8):
    from kernel_gym.deploy.plan import kernel_configs

    qwen = load_model("qwen3-30b-a3b")
    spec = dataclasses.replace(qwen, dtype_bytes=1) if fp8 else qwen
    deps = [Deployment("vllm", 1, 1, 8, 64, 8192, 256, 512), Deployment("vllm", 2, 4, 1, 64, 8192, 256, 512),
            Deployment("vllm", 1, 1, 2, 64, 8192, 256, 512), Deployment("sglang", 1, 2, 4, 1, 8192, 256, 256),
            Deployment("sglang", 1, 1, 8, 1, 8192, 256, 256), Deployment("sglang", 4, 2, 1, 1, 8192, 256, 256)]
    for dep in deps:
        (f,) = kernel_configs(spec, dep, {})
        e, n = _written_shape(spec, f["write_with"])
        assert (e, n) == (f["local_experts"], f["N"]) and f["file"].startswith(f"E={e},N={n},"), (dep.name, f)
        assert ("SGLang's own tuner" in f["write_with"]) == (fp8 and dep.engine == "sglang")


# ---- 4. the H200's reported memory, and each release's share in the validity check ---------------------------------

def test_h200_memory_is_the_reported_total():
    recorded = re.search(r"/\s*(\d+)MiB", (ROOT / "benchmarks" / "live_e2e" / "machine.txt").read_text())
    assert recorded and H200_MEMORY_BYTES == int(recorded.group(1)) * 2**20 == 143771 * 2**20


def test_validity_uses_each_releases_memory_share():
    """128 GB of weights on one GPU: over SGLang's 0.9 of the GPU's 150.8 GB less a step's activations (too little KV
    for one max_model_len request), within vLLM 0.33's 0.92 and vLLM 0.34's (all of it less a margin). The
    deployment's validity is its KV sizing's answer under every release; vLLM 0.34 was refused by a fixed
    0.9 x 141 GB."""
    spec = dataclasses.replace(MIXTRAL, name="mixtral-44-layers", num_layers=44)
    for engine in ("vllm-0.33.0", "vllm-0.34.0", "sglang-0.5.23"):
        dep = Deployment(engine, 1, 1, 1, 64, 8192, 256, 512)
        why = why_invalid_deployment(spec, dep)
        assert (why == "") == (kv_tokens_per_rank(spec, dep) >= MAX_MODEL_LEN) and "0.9 x" not in why, (engine, why)
    assert why_invalid_deployment(spec, Deployment("vllm-0.34.0", 1, 1, 1, 64, 8192, 256, 512)) == ""
    # a caller that sizes its KV pool at a share passes it (ServingTPEP-v0: the simulator's 0.9 x 151 GB): 139 GB of
    # weights fit the whole GPU, not 0.9 of it
    spec48 = dataclasses.replace(MIXTRAL, name="mixtral-48-layers", num_layers=48)
    assert why_invalid(spec48, Layout(1, 1), 1) == ""
    assert "0.9 x 151 GB" in why_invalid(spec48, Layout(1, 1), 1, H200_MEMORY_BYTES, 0.9)
    assert "150.8 GB" in why_invalid(load_model("deepseek-v3"), Layout(1, 1), 1)


# ---- 5. shared experts in the per-GPU weights ----------------------------------------------------------------------

def test_gpu_weights_count_shared_experts():
    """Qwen2-57B-A14B's shared expert (intermediate 20480): sliced by TP like the dense MLP, whole on every EP rank."""
    spec = ZOO["qwen2-57b-a14b"]
    assert (spec.num_shared_experts, spec.shared_intermediate) == (1, 20480)
    plain = dataclasses.replace(spec, num_shared_experts=0, shared_intermediate=0)
    shared = spec.num_layers * 3 * spec.hidden * 20480 * spec.dtype_bytes
    assert gpu_weight_bytes(spec, Layout(1, 1)) == pytest.approx(spec.weight_bytes)
    for lay in (Layout(2, 1), Layout(4, 1), Layout(1, 4), Layout(2, 2)):
        assert gpu_weight_bytes(spec, lay) - gpu_weight_bytes(plain, lay) == pytest.approx(shared / lay.tp), lay


def test_floor_keeps_a_replicas_pick_the_release_can_launch():
    """4 x TP2 holds Mixtral-8x22B's 140 GB per GPU within the whole GPU, not with vLLM 0.33's KV cache (0.92 of the
    GPU's 150.8 GB): 2 x TP4 instead. vLLM 0.34 (all of it less a margin) leaves a TP2 rank 61k tokens of KV:
    4 x TP2."""
    from kernel_gym.deploy.plan import baselines

    spec = load_model("mixtral-8x22b")
    assert baselines(spec, "vllm-0.33.0", 8)["hand_replicas"].layout_name == "2xTP4"
    assert baselines(spec, "vllm", 8)["hand_replicas"].layout_name == "4xTP2"


# ---- session 62, the docs audit: plan's flags and the command it prints --------------------------------------------

def test_plan_refuses_bad_numbers_before_the_work(capsys):
    """--next -1 failed after 20 s with IndexError; negative --train-steps ran ("training the agent (-5 steps)"); a
    negative --rate-scale printed the banner, then a message naming no flag."""
    base = ["--model", "mixtral-8x7b", "--gpus", "2", "--trace", "bundled", "--no-mlflow"]
    for flag, value, said in (("--next", "-1", "--next -1: give an integer >= 0"),
                              ("--train-steps", "-5", "--train-steps -5"), ("--refine-rounds", "-2", "--refine-rounds"),
                              ("--rate-scale", "-1", "--rate-scale -1: give a positive number"),
                              ("--window-s", "0", "--window-s 0")):
        assert main([*base, flag, value]) == 2
        err = capsys.readouterr().err
        assert said in err and "[plan] mixtral" not in err, (flag, err)


def test_the_printed_export_command_runs_where_the_shape_is_unmeasured():
    """plan printed `kernel-gym export ... --tp 8`, which export refuses where vLLM's kernel design was never timed at
    the shape (Mixtral at TP 8); the command now carries --force and says it writes the engine's own entries."""
    from kernel_gym.deploy.plan import kernel_configs

    mixtral = load_model("mixtral-8x7b")
    (tp8,) = kernel_configs(mixtral, Deployment("vllm", 1, 8, 1, 64, 8192, 256, 512), {})
    (tp2,) = kernel_configs(mixtral, Deployment("vllm", 1, 2, 1, 64, 8192, 256, 512), {})
    assert "--tp 8 --out DIR --force" in tp8["write_with"] and "kernel-gym tune --engine vllm" in tp8["write_with"]
    assert "--force" not in tp2["write_with"]  # measured at TP 2: export writes it from measurements
    assert "kernel_gym_configs_priced" in tp2 and "configs_used" not in tp2
