"""Docstring sections shared by the three kernel envs (kept in one place so they cannot drift apart)."""

COMMON = """
    ## Action Space

    `Discrete(N)`: action i launches config i of the env's config catalogue (`env.unwrapped.catalogue.configs`), the
    configs that are fastest (or within `near`) on at least one training workload (a greedy cover), the
    `catalogue_depth` (2) fastest of each training workload, and every default config, at most
    `max_catalogue`; built from the backend's measurements, stored with the policy. `action_masks()` (MaskablePPO)
    is False for entries that the knob space's rules reject for the workload or that the backend cannot answer.

    ## Rewards

    `oracle_ms / measured_ms` in (0, 1]: 1 means the config is as fast as the best config the backend knows for this
    workload, so rewards compare across shapes. A masked action, or a config that fails anyway (compile error, out of
    resources, wrong result, crash), ends the episode with reward -1 and `info["error_type"]` (a
    kernel_gym.measure.types status) and `info["reason"]`. On the live backend the best known time improves when a
    faster one is measured (never above 1).

    ## Starting State

    A workload drawn from the traffic profile (weights of a `WorkloadProfile`, uniform for the named profiles) among
    the chosen split's workloads; `reset(options={"workload_index": i})` picks one.

    ## Episode End

    After one step (terminated=True): the config is chosen with zero measurements at decision time, as a deployed
    dispatcher must. No truncation.

    ## Arguments

    - `backend`: "recorded" (default: the store of H200 measurements, CPU, deterministic), "live" (compile and time
      on the GPU) or a Backend object. The `-live-v0` ids set "live" and are registered nondeterministic=True.
    - `model`: a built-in model spec name or a ModelSpec (shapes of the workload grid).
    - `profile`: "grid" (the model's collection grid), "eval", "small" (CPU-interpreter shapes) or a WorkloadProfile.
    - `split`: "train" | "heldout" | "all"; `holdout` (0.25) and `split_seed` (0) make the deterministic split.
    - `catalogue`, `references`: reuse a catalogue and measured references (training passes them so the backend is
      swept once); otherwise both are built from the backend at construction (a full sweep on a live backend).
    - `near`, `max_catalogue`, `catalogue_depth`: catalogue construction.
    - `obs_jitter` (0): for training, Gaussian noise (standard deviation in log2 units) added to the workload axes of
      each reset's observation (decode: batch and context; MoE: tokens; prefill: every sequence length, scaled
      together), the reward still that of the exact
      workload; it rewards configs that win across neighbouring grid points, which is what held-out shapes between
      them need (`kernel-gym train` sets it per env: the profile's `obs_jitter`). For MoE (profile `jitter_mask`) the
      action mask also drops the entries the knob space rejects at the moved workload, so near a rule's boundary
      (the fused top-k sum's 96-token limit) the policy learns what is best without the rejected configs.

    ## Version History

    - v0: initial version (one-step, catalogue actions, oracle-ratio reward).
"""
