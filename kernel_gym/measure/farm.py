"""A measurement farm on Ray: `kernel-gym collect --ray [ADDRESS]` measures the plan on every GPU of a Ray cluster.

- **Cluster.** No address: a local Ray cluster on this machine (its GPUs; with `--device cpu`, `--gpus` fake GPUs).
  With an address (`auto`, or `HOST:PORT` of a `ray start --head`): join it; every host that ran
  `ray start --address=HOST:PORT` contributes its GPUs.
- **One actor per GPU** (`num_gpus=1`, pinned to its node). The actor keeps today's isolation: it drives a
  `LiveBackend`, so every measurement runs in an `IsolatedRunner` worker subprocess that a hang, fault or OOM kills and
  restarts with the reason stored, and it owns a compile pool of the node's CPUs (the node's CPUs divided among its
  GPUs, one kept for the actor), which compiles the chunks reserved for the actor while the GPU times the current one.
  Actors on one host share the host's Triton cache.
- **Dynamic queue.** Work is the plan's chunks (up to 64 configs of one workload), workloads longest first by
  estimated cost (with a budget: the plan's round-robin order, so a cut leaves every kernel covered). An idle actor
  takes the next chunk of the workload it just measured (inputs and reference are reused) or the queue's head; it has
  one chunk in flight and `lookahead` reserved (compiling); an actor with nothing left steals another's reserved chunk,
  so a slow chunk never holds up others. The driver waits on all outstanding chunks (`ray.wait`).
- **One store.** Results stream to the driver, which writes the SQLite store as `collect` does (one transaction per
  chunk), with the host and GPU of each row. An actor killed mid-chunk loses only that chunk's unstored results: the
  chunk goes back to the queue (after 3 failed attempts its configs are stored as `crash` with the reason), and Ray
  restarts the actor. A killed driver takes its actors with it (Ray ends a job's actors, their workers die with them);
  a rerun skips what is stored (`collect.drop_done`) and resumes without duplicates.
- **Cross-GPU noise** (`collect --ray --noise N`): the noise study's subset measured N times on every GPU; the rows go
  to the store's `replicas` table and the report compares the GPUs (`storetools.gpu_comparison`).

Ray is optional (`pip install 'kernel_gym[ray]'`); without it `--ray` exits 2 with that line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from kernel_gym.measure.collect import (
    CHUNK,
    CollectOptions,
    PlanItem,
    _fmt,
    build_plan,
    contexts_for,
    drop_done,
    estimate_seconds,
    load_plan_file,
    noise_items,
    noisy_plan,
)
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.timing import DEFAULT_TIMING, TimingOptions
from kernel_gym.measure.types import CRASH, OK, Measurement

RAY_MISSING = "collect --ray needs Ray, which is not installed: pip install 'kernel_gym[ray]'"
FORWARDED_ENV = ("PYTHONPATH", "TRITON_CACHE_DIR", "TRITON_INTERPRET")  # plus every KERNEL_GYM_* variable
MAX_ATTEMPTS = 3  # a chunk whose actor died this often is split in two; a single config, stored as crash


class RayMissing(SystemExit):
    pass


def require_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayMissing(RAY_MISSING) from exc
    return ray


@dataclass
class FarmOptions:
    address: str | None = None  # None: start a local cluster; "auto" or HOST:PORT: join one
    lookahead: int = -1  # chunks reserved (compiling) per actor; -1: from the compile pool size (0 without a pool)
    actor_cpus: float = -1  # CPUs each actor reserves (its compile pool is one fewer); -1: node CPUs / node GPUs
    max_actor_restarts: int = 3
    local_cpus: int | None = None  # local cluster only (None: Ray's detection)
    object_store_mb: int = 0  # local cluster only (0: Ray's default)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the actors
    keep_actors: bool = False  # keep the actors (and their workers) for the next collect_farm in this process
    allow_open_cluster: bool = False  # start a local cluster without token authentication (Ray < 2.52)


# ---- connecting ---------------------------------------------------------------------------------------------------


TOKEN_AUTH_RAY = (2, 52)  # the first Ray with token authentication (RAY_AUTH_MODE=token)
OPEN_CLUSTER = ("anyone who reaches a Ray cluster's ports can run code on it (Ray's security docs); ")


def ray_version(ray: Any) -> tuple[int, ...]:
    parts = []
    for x in str(getattr(ray, "__version__", "0")).split(".")[:2]:
        digits = "".join(ch for ch in x if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def connect(farm: FarmOptions, device: str, gpus: int) -> bool:
    """Join or start a cluster; True when this call initialised Ray (and so shuts it down at the end).

    A cluster started here listens on 127.0.0.1 only, with Ray's token authentication on (RAY_AUTH_MODE=token: Ray
    >= 2.52 generates the token for a local cluster); an older Ray, which cannot authenticate, is refused unless
    --allow-open-cluster. Joining an ADDRESS uses that cluster's own settings: a warning says so when this process
    has no token to present."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": True}
    if farm.address:
        if os.environ.get("RAY_AUTH_MODE") != "token":
            print(f"warning: collect --ray {farm.address}: joining a cluster without token authentication; "
                  f"{OPEN_CLUSTER}start it with RAY_AUTH_MODE=token (Ray >= 2.52) and set RAY_AUTH_MODE and "
                  "RAY_AUTH_TOKEN here", file=sys.stderr, flush=True)
        ray.init(address=farm.address, **kw)
    else:
        kw["_node_ip_address"] = "127.0.0.1"  # a local cluster is reachable from this machine only
        if ray_version(ray) >= TOKEN_AUTH_RAY:
            os.environ["RAY_AUTH_MODE"] = "token"  # inherited by the processes ray.init starts
        elif not farm.allow_open_cluster:
            raise ValueError(f"collect --ray: Ray {getattr(ray, '__version__', '?')} has no token authentication "
                             f"(Ray >= 2.52 has); {OPEN_CLUSTER}upgrade Ray (pip install 'ray>=2.52'), or pass "
                             "--allow-open-cluster to start it on 127.0.0.1 without authentication")
        if device == "cpu":  # interpreter: fake GPUs, so the farm's machinery runs on a CPU machine
            kw["num_gpus"] = max(1, gpus)
        if farm.local_cpus:
            kw["num_cpus"] = farm.local_cpus
        if farm.object_store_mb:
            kw["object_store_memory"] = farm.object_store_mb * 1024 * 1024
        ray.init(address="local", **kw)  # a new cluster, even when one started by `ray start` is running here
    return True


def _actor_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in FORWARDED_ENV or k.startswith("KERNEL_GYM_")}
    env.update(extra)
    return env


# ---- the actor ---------------------------------------------------------------------------------------------------


def _device_name(device: str) -> str:
    """The CUDA device name as the plain collection stores it (torch.cuda.get_device_name), asked in a short-lived
    process so the actor itself never holds a CUDA context on the GPU it measures."""
    if device == "cpu":
        return "cpu-interpreter"
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"farm actor on {socket.gethostname()}: no CUDA device ({out.stderr.strip()[-300:]})")
    return out.stdout.strip().splitlines()[-1]


class Measurer:
    """One GPU: a LiveBackend (isolated worker subprocess + compile pool) fed one chunk at a time by the driver."""

    def __init__(self, device: str, timing: TimingOptions, compile_workers: int) -> None:
        import ray

        from kernel_gym.measure.live import LiveBackend

        self.device, self.timing, self.pool = device, timing, compile_workers
        ids = ray.get_gpu_ids()
        self.gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or (str(ids[0]) if ids else "")
        self.host = socket.gethostname()
        self.device_name = _device_name(device)
        self.fams: dict[str, Any] = {}
        # gpu=None: the worker inherits CUDA_VISIBLE_DEVICES, which Ray set to this actor's GPU
        self.backend = LiveBackend(gpu=None, device=device, compile_workers=compile_workers, timing=timing)

    def where(self, kernels: list[str]) -> dict[str, Any]:
        """Host, GPU, process and the contexts (device, software, kernel source) this actor's rows will carry."""
        from kernel_gym.measure.worker import resolve_family

        for ref in kernels:
            self.fams.setdefault(ref, resolve_family(ref))
        contexts = contexts_for(kernels, self.device_name)
        return {"host": self.host, "gpu": self.gpu, "pid": os.getpid(), "device": self.device_name,
                "contexts": {ref: ctx.__dict__ for ref, ctx in contexts.items()}, "pool": self.pool}

    def _workload(self, item: PlanItem) -> Any:
        from kernel_gym.measure.worker import resolve_family, workload_from_key

        fam = self.fams.setdefault(item.kernel, resolve_family(item.kernel))
        return workload_from_key(fam, item.workload_key)

    def prefetch(self, items: list[PlanItem]) -> None:
        from kernel_gym.kernels.space import Config

        for item in items:
            self.backend.prefetch(item.kernel, self._workload(item), [Config.parse(c) for c in item.configs])

    def measure(self, item: PlanItem, deadline: float = 0.0) -> list[Measurement] | None:
        """One chunk, one Measurement per config; None when the budget ran out before it started."""
        from kernel_gym.kernels.space import Config

        if deadline and time.time() >= deadline:
            return None
        # by reference (the worker resolves the same string), so a family instance of a class defined elsewhere works
        return self.backend.measure_many(item.kernel, self._workload(item), [Config.parse(c) for c in item.configs])

    def noise(self, items: list[tuple[str, str, list[str]]], repeats: int) -> list[list[Measurement]]:
        """The items measured `repeats` times, each time in a fresh worker process (like collect's noise study)."""
        from kernel_gym.kernels.space import Config
        from kernel_gym.measure.worker import resolve_family, workload_from_key

        runs = []
        for _ in range(repeats):
            self.backend.runner.close()  # the next measure_many starts a fresh worker
            rows: list[Measurement] = []
            for ref, wkey, cfgs in items:
                wl = workload_from_key(resolve_family(ref), wkey)
                rows.extend(self.backend.measure_many(ref, wl, [Config.parse(c) for c in cfgs]))
            runs.append(rows)
        return runs

    def close(self) -> None:
        self.backend.close()


_ACTOR: Any = None
_KEPT: dict[tuple, list[tuple[Any, str]]] = {}  # FarmOptions.keep_actors: (device, timing, pools) -> [(actor, node)]


def _remote_measurer(ray: Any) -> Any:
    """Measurer as a Ray actor class with two concurrency groups: `prefetch` (and `where`, `close`) run beside a
    `measure` in flight; measurements themselves never overlap."""
    global _ACTOR
    if _ACTOR is None:
        class MeasurerActor(Measurer):
            @ray.method(concurrency_group="measure")
            def measure(self, item: PlanItem, deadline: float = 0.0) -> tuple[str, str, list[Measurement] | None]:
                return self.host, self.gpu, Measurer.measure(self, item, deadline)

            @ray.method(concurrency_group="measure")
            def noise(self, items: list[tuple[str, str, list[str]]], repeats: int) -> list[list[Measurement]]:
                return Measurer.noise(self, items, repeats)

            @ray.method(concurrency_group="control")
            def prefetch(self, items: list[PlanItem]) -> None:
                Measurer.prefetch(self, items)

            @ray.method(concurrency_group="control")
            def where(self, kernels: list[str]) -> dict[str, Any]:
                return Measurer.where(self, kernels)

            @ray.method(concurrency_group="control")
            def close(self) -> None:
                Measurer.close(self)

        _ACTOR = ray.remote(concurrency_groups={"measure": 1, "control": 1})(MeasurerActor)
    return _ACTOR


# ---- the work queue -------------------------------------------------------------------------------------------------


def chunk_cost(item: PlanItem, timing: TimingOptions = DEFAULT_TIMING) -> float:
    """Estimated GPU seconds of a chunk (collect.estimate_seconds' roofline)."""
    return estimate_seconds([[item]], CollectOptions(timing=timing), 1)["gpu_s"]


class WorkQueue:
    """Chunks grouped by (kernel, workload), groups in a fixed order. take(prefer) returns the next chunk of the
    preferred group (the workload an actor just measured) when there is one, else the head group's."""

    def __init__(self, items: list[PlanItem]) -> None:
        self.groups: dict[tuple[str, str], deque[PlanItem]] = {}
        self.order: deque[tuple[str, str]] = deque()
        for item in items:
            key = (item.kernel, item.workload_key)
            if key not in self.groups:
                self.groups[key] = deque()
                self.order.append(key)
            self.groups[key].append(item)

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups.values())

    def take(self, prefer: tuple[str, str] | None = None) -> PlanItem | None:
        if prefer is not None and self.groups.get(prefer):
            return self.groups[prefer].popleft()
        while self.order:
            group = self.groups.get(self.order[0])
            if group:
                return group.popleft()
            self.order.popleft()
        return None

    def put_back(self, item: PlanItem) -> None:
        """Front of the queue (a chunk whose actor died, or a reservation given up)."""
        key = (item.kernel, item.workload_key)
        self.groups.setdefault(key, deque()).appendleft(item)
        self.order.appendleft(key)


def order_plan(plan: list[list[PlanItem]], timing: TimingOptions, longest_first: bool) -> list[PlanItem]:
    """The plan's chunks, workloads longest first by estimated cost (stable), or in the plan's order."""
    if not longest_first:
        return [c for chunks in plan for c in chunks]
    costed = [(sum(chunk_cost(c, timing) for c in chunks), i, chunks) for i, chunks in enumerate(plan)]
    costed.sort(key=lambda t: (-t[0], t[1]))
    return [c for _, _, chunks in costed for c in chunks]


# ---- the driver ---------------------------------------------------------------------------------------------------


@dataclass
class Slot:
    """One actor (one GPU) as the driver sees it."""

    actor: Any
    node: str
    info: dict[str, Any] = field(default_factory=dict)
    running: PlanItem | None = None
    ref: Any = None
    reserved: deque = field(default_factory=deque)
    last: tuple[str, str] | None = None
    failures: int = 0  # actor failures since its last chunk stored
    ping: Any = None  # where() in flight after a failure: the actor is back when it answers
    ping_at: float = 0.0  # when to send the next ping (0: none wanted)
    down_since: float = 0.0
    dead: bool = False
    chunks_done: int = 0
    rows: int = 0

    @property
    def origin(self) -> tuple[str, str]:
        return self.info.get("host", ""), self.info.get("gpu", "")

    @property
    def label(self) -> str:
        return f"{self.info.get('host', '?')}:gpu{self.info.get('gpu', '?')}"

    @property
    def busy(self) -> bool:
        return self.running is not None or self.ping is not None or self.ping_at > 0


class Farm:
    """The driver's state: slots, queues (one per distinct set of contexts), store, counters."""

    RECOVERY_S = 300.0  # an actor not back this long after a failure is given up

    def __init__(self, opts: CollectOptions, farm: FarmOptions, log: Any = sys.stderr) -> None:
        self.opts, self.farm, self.log = opts, farm, log
        self.ray = require_ray()
        self.slots: list[Slot] = []
        self.written = 0
        self.rejected = 0  # worker results refused by validate_results
        self.requeued = 0
        self.actor_failures = 0
        self.attempts: dict[tuple[str, str, tuple[str, ...]], int] = {}
        self.queues: dict[str, WorkQueue] = {}
        self.group_of: dict[int, str] = {}
        self.contexts_of: dict[str, dict[str, Context]] = {}
        self.lookahead: dict[int, int] = {}
        self.stopped_by_budget = False
        self.deadline = 0.0

    # actors

    def start_actors(self) -> None:
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU", 0) >= 1]
        if not nodes:
            raise SystemExit("collect --ray: the Ray cluster has no GPU (start each host with `ray start` on a GPU "
                             "machine; with --device cpu a local cluster gets fake GPUs)")
        want = self.opts.gpus or sum(int(n["Resources"]["GPU"]) for n in nodes)
        kept_key = (self.opts.device, self.opts.timing, self.opts.compile_workers, self.farm.actor_cpus, want)
        if self.farm.keep_actors and kept_key in _KEPT:
            self.slots = [Slot(actor, node) for actor, node in _KEPT[kept_key]]
        else:
            cls = _remote_measurer(ray)
            env = _actor_env(self.farm.env) if self.farm.address or self.farm.env else {}
            for node in sorted(nodes, key=lambda n: n["NodeManagerAddress"]):
                n_gpu, n_cpu = int(node["Resources"]["GPU"]), node["Resources"].get("CPU", 0.0)
                cpus = self.farm.actor_cpus if self.farm.actor_cpus >= 0 else max(1.0, n_cpu // n_gpu)
                if self.opts.device != "cuda":
                    pool = 0
                elif self.opts.compile_workers >= 0:
                    pool = self.opts.compile_workers // n_gpu
                else:
                    pool = max(0, int(cpus) - 1)
                for _ in range(n_gpu):
                    if len(self.slots) >= want:
                        break
                    actor = cls.options(
                        num_gpus=1, num_cpus=cpus, max_restarts=self.farm.max_actor_restarts, max_task_retries=0,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                        runtime_env={"env_vars": env} if env else None,
                    ).remote(self.opts.device, self.opts.timing, pool)
                    self.slots.append(Slot(actor, node["NodeID"]))
            if self.farm.keep_actors:
                _KEPT[kept_key] = [(s.actor, s.node) for s in self.slots]
        infos = ray.get([s.actor.where.remote(self.opts.kernels) for s in self.slots])
        for slot, info in zip(self.slots, infos):
            slot.info = info
            look = self.farm.lookahead
            self.lookahead[id(slot)] = look if look >= 0 else (max(1, (2 * info["pool"] * 8) // CHUNK)
                                                               if info["pool"] else 0)

    # queue

    def plan(self, store: MeasurementStore) -> dict[str, Any]:
        opts = self.opts
        from kernel_gym.measure.recorded import MAX_SPREAD

        plan = None
        stats: dict[str, Any] = {}
        for slot in self.slots:
            sig = repr(sorted((ref, tuple(sorted(c.items()))) for ref, c in slot.info["contexts"].items()))
            self.group_of[id(slot)] = sig
            if sig in self.queues:
                continue
            contexts = {ref: Context(**c) for ref, c in slot.info["contexts"].items()}
            self.contexts_of[sig] = contexts
            for ref, ctx in contexts.items():
                store.set_meta(f"context:{ref}", ctx.__dict__)
            if opts.remeasure_noisy:
                todo = noisy_plan(store, contexts, MAX_SPREAD)
                total = sum(len(i.configs) for chunks in todo for i in chunks)
            else:
                if plan is None:
                    plan = load_plan_file(opts.plan_file, opts.kernels) if opts.plan_file else build_plan(opts)
                total = sum(len(i.configs) for chunks in plan for i in chunks)
                todo = drop_done(plan, store, contexts)
            remaining = sum(len(i.configs) for chunks in todo for i in chunks)
            self.queues[sig] = WorkQueue(order_plan(todo, opts.timing, longest_first=not opts.budget_s))
            stats[sig] = {"device": next(iter(contexts.values())).device, "planned": total, "remaining": remaining,
                          "workloads": len(todo), "gpu_s": estimate_seconds(todo, opts, 1)["gpu_s"]}
        return stats

    def _queue(self, slot: Slot) -> WorkQueue:
        return self.queues[self.group_of[id(slot)]]

    def _next_for(self, slot: Slot) -> PlanItem | None:
        """The slot's next chunk: its own reservation, else the queue, else one stolen from another slot."""
        if slot.reserved:
            return slot.reserved.popleft()
        item = self._queue(slot).take(slot.last)
        if item is not None:
            return item
        victims = [s for s in self.slots if s is not slot and s.reserved and self.group_of[id(s)] ==
                   self.group_of[id(slot)]]
        if victims:
            return max(victims, key=lambda s: len(s.reserved)).reserved.pop()
        return None

    def _refill_reservation(self, slot: Slot) -> None:
        new = []
        while len(slot.reserved) < self.lookahead[id(slot)]:
            item = self._queue(slot).take(slot.last)
            if item is None:
                break
            slot.reserved.append(item)
            new.append(item)
        if new:
            slot.actor.prefetch.remote(new)

    def _budget_over(self) -> bool:
        return bool(self.deadline and time.time() >= self.deadline)

    def dispatch(self, slot: Slot) -> None:
        if slot.dead or slot.busy or self._budget_over():
            return
        own = bool(slot.reserved)
        item = self._next_for(slot)
        if item is None:
            return
        if self.lookahead[id(slot)] and not own:  # not compiled ahead by this actor (first chunk, or stolen): now
            slot.actor.prefetch.remote([item])
        slot.running, slot.last = item, (item.kernel, item.workload_key)
        slot.ref = slot.actor.measure.remote(item, self.deadline)
        self._refill_reservation(slot)

    def _give_back(self, slot: Slot) -> None:
        while slot.reserved:
            self._queue(slot).put_back(slot.reserved.pop())

    def _why(self, exc: BaseException) -> str:
        lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
        return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]  # a task error's last line is its cause

    def _failed(self, slot: Slot, item: PlanItem, exc: BaseException, store: MeasurementStore) -> None:
        """The actor died (or raised) measuring item: the item back to the queue; after MAX_ATTEMPTS split in halves
        (each queued again) until the one config that kills the actor is stored as crash. The slot waits until its
        actor answers again (Ray restarts it) before it gets more work."""
        from ray.exceptions import RayTaskError

        self.actor_failures += 1
        slot.failures += 1
        key = (item.kernel, item.workload_key, item.configs)
        self.attempts[key] = self.attempts.get(key, 0) + 1
        why = self._why(exc)
        print(f"\n[farm] {slot.label} failed on a chunk of {len(item.configs)} configs ({why}); "
              f"attempt {self.attempts[key]} of {MAX_ATTEMPTS}", file=self.log)
        self._give_back(slot)
        ctx = self.contexts_of[self.group_of[id(slot)]][item.kernel]
        if self.attempts[key] >= MAX_ATTEMPTS and len(item.configs) > 1:
            # Find the culprit instead of writing the whole chunk off: each half goes back with its own attempts.
            half = len(item.configs) // 2
            for part in (item.configs[:half], item.configs[half:]):
                self._queue(slot).put_back(PlanItem(item.kernel, item.workload_key, part, item.grid))
            self.requeued += 2
        elif self.attempts[key] >= MAX_ATTEMPTS:
            ms = [Measurement(kernel=ctx.kernel, workload=item.workload_key, config=c, status=CRASH,
                              reason=f"farm actor failed {MAX_ATTEMPTS} times measuring this chunk: {why}"[:400],
                              source="live" if self.opts.device == "cuda" else "interpreter")
                  for c in item.configs]
            if not self.opts.remeasure_noisy:
                self.written += store.put_many(ctx, ms, origin=slot.origin)
        else:
            self._queue(slot).put_back(item)
            self.requeued += 1
        if slot.failures > MAX_ATTEMPTS * (self.farm.max_actor_restarts + 1):
            slot.dead = True
            print(f"[farm] {slot.label} is gone ({why})", file=self.log)
        elif not isinstance(exc, RayTaskError):
            # the actor itself failed (ActorDiedError even while Ray restarts it, in some Ray versions): ping it until
            # it answers again; a ping that says the actor is dead for good gives the slot up
            slot.ping_at, slot.down_since = time.time(), slot.down_since or time.time()

    def _ping_done(self, slot: Slot) -> None:
        from ray.exceptions import ActorDiedError, RayError

        ref, slot.ping = slot.ping, None
        try:
            slot.info = self.ray.get(ref, timeout=60) | {"node": slot.node}
        except RayError as exc:
            limit = 30.0 if isinstance(exc, ActorDiedError) else self.RECOVERY_S  # died: Ray may still restart it
            if time.time() - slot.down_since > limit:
                slot.dead = True
                print(f"[farm] {slot.label} did not come back ({self._why(exc)})", file=self.log)
            else:
                slot.ping_at = time.time() + 1.0
            return
        slot.down_since = 0.0
        print(f"[farm] {slot.label} is back (pid {slot.info['pid']})", file=self.log)
        self.dispatch(slot)

    def run(self, store: MeasurementStore, remaining: int, t0: float,
            hook: Callable[[Farm], None] | None = None) -> None:
        ray = self.ray
        from ray.exceptions import GetTimeoutError, RayError

        for slot in self.slots:
            self.dispatch(slot)
        last_print = 0.0
        while True:
            now = time.time()
            for slot in self.slots:
                if slot.ping_at and now >= slot.ping_at and not slot.dead:
                    slot.ping_at, slot.ping = 0.0, slot.actor.where.remote(self.opts.kernels)
            waiting = {s.ref: s for s in self.slots if s.running is not None}
            pings = {s.ping: s for s in self.slots if s.ping is not None}
            if not waiting and not pings:
                for slot in self.slots:
                    self.dispatch(slot)
                if any(s.busy for s in self.slots if not s.dead):
                    if not any(s.running is not None or s.ping is not None for s in self.slots):
                        time.sleep(0.2)  # only pings scheduled for later
                    continue
                break
            ready, _ = ray.wait([*waiting, *pings], num_returns=1, timeout=1.0)
            for ref in ready:
                if ref in pings:
                    self._ping_done(pings[ref])
                    continue
                slot = waiting[ref]
                item, slot.running, slot.ref = slot.running, None, None
                try:
                    host, gpu, ms = ray.get(ref, timeout=60)
                except (RayError, GetTimeoutError) as exc:
                    self._failed(slot, item, exc, store)
                    self.dispatch(slot)
                    continue
                slot.failures = 0
                if ms is None:  # the budget ran out before the chunk started
                    self.stopped_by_budget = True
                    continue
                ms, rejected = validate_results(item, ms, f"{host}:gpu{gpu}")
                if rejected:  # never stored: a worker answers only for what it was sent, with plausible times
                    self.rejected += len(rejected)
                    print(f"[farm] {len(rejected)} results of {host}:gpu{gpu} rejected ({rejected[0]})",
                          file=sys.stderr, flush=True)
                if self.opts.remeasure_noisy:  # a failed re-measurement keeps the stored ok row
                    ms = [m for m in ms if m.status == OK]
                ctx = self.contexts_of[self.group_of[id(slot)]][item.kernel]
                n = store.put_many(ctx, ms, replace=self.opts.remeasure_noisy, origin=(host, gpu))
                self.written += n
                slot.rows += n
                slot.chunks_done += 1
                self.dispatch(slot)
            if self._budget_over():
                self.stopped_by_budget = True
                for slot in self.slots:
                    self._give_back(slot)
            if hook is not None:
                hook(self)
            if time.time() - last_print >= 2.0:
                last_print = time.time()
                rate = self.written / max(1e-9, time.time() - t0)
                eta = _fmt((remaining - self.written) / rate) if rate > 0 else "?"
                alive = sum(not s.dead for s in self.slots)
                print(f"\r[farm] {self.written}/{remaining} rows {rate:6.1f}/s ETA {eta}; {alive} actors, "
                      f"{sum(len(q) for q in self.queues.values())} chunks queued, {self.requeued} re-queued   ",
                      end="", file=self.log, flush=True)

    def close(self) -> None:
        if self.farm.keep_actors:
            return
        ray = self.ray
        try:
            ray.get([s.actor.close.remote() for s in self.slots if not s.dead], timeout=30)
        except Exception:  # noqa: BLE001,S110 - a dead actor has nothing left to close
            pass
        for s in self.slots:
            try:
                ray.kill(s.actor, no_restart=True)
            except Exception:  # noqa: BLE001,S110
                pass


def release_kept_actors() -> None:
    """Close and kill the actors FarmOptions.keep_actors kept (tests: before the cluster shuts down)."""
    ray = require_ray()
    for kept in _KEPT.values():
        for actor, _ in kept:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001,S110
                pass
    _KEPT.clear()


def collect_farm(opts: CollectOptions, farm: FarmOptions | None = None, log: Any = sys.stderr,
                 hook: Callable[[Farm], None] | None = None) -> dict[str, Any]:
    """collect() on a Ray cluster; the same summary keys (shard_exit_codes: 0 per actor that stayed alive, 1 per
    actor given up, and a 1 when chunks were left unmeasured) plus the farm's: actors, rows per GPU, re-queued."""
    farm = farm or FarmOptions()
    require_ray()
    t0 = time.time()
    started = connect(farm, opts.device, opts.gpus)
    f = Farm(opts, farm, log)
    f.deadline = t0 + opts.budget_s if opts.budget_s > 0 else 0.0
    store = MeasurementStore(opts.db)
    try:
        f.start_actors()
        stats = f.plan(store)
        planned = sum(s["planned"] for s in stats.values())
        remaining = sum(s["remaining"] for s in stats.values())
        for s in stats.values():
            print(f"[farm] {s['device']}: plan {s['planned']} configs; already stored {s['planned'] - s['remaining']};"
                  f" to measure {s['remaining']} in {s['workloads']} workloads (GPU ~{_fmt(s['gpu_s'])} on one GPU)",
                  file=log)
        print(f"[farm] {len(f.slots)} actors: " + ", ".join(f"{s.label} ({s.info['device']}, pool {s.info['pool']})"
                                                             for s in f.slots), file=log)
        store.set_meta("farm:last_run", {"started": t0, "actors": [s.info | {"node": s.node} for s in f.slots]})
        f.run(store, remaining, t0, hook)
        print(f"\n[farm] wrote {f.written} rows in {_fmt(time.time() - t0)}; store holds {store.count()} rows; "
              f"integrity {store.integrity_check()}; re-queued chunks {f.requeued}", file=log)
        if opts.out:
            n = store.export_snapshot(opts.out)
            print(f"[farm] exported {n} rows to {opts.out}", file=log)
        left = sum(len(q) for q in f.queues.values()) + sum(len(s.reserved) for s in f.slots)
        return {"planned": planned, "already_stored": planned - remaining, "written": f.written,
                "seconds": time.time() - t0, "stopped_by_budget": f.stopped_by_budget and f.written < remaining,
                "shard_exit_codes": [int(s.dead) for s in f.slots] + ([1] if left and not f.stopped_by_budget else []),
                "actors": [{"host": s.info.get("host"), "gpu": s.info.get("gpu"), "device": s.info.get("device"),
                            "chunks": s.chunks_done, "rows": s.rows, "dead": s.dead} for s in f.slots],
                "requeued": f.requeued, "actor_failures": f.actor_failures, "chunks_left": left}
    finally:
        f.close()
        store.close()
        if started:
            f.ray.shutdown()


# ---- noise across GPUs --------------------------------------------------------------------------------------------


def farm_noise_study(opts: CollectOptions, repeats: int, farm: FarmOptions | None = None,
                     workloads_per_kernel: int = 12, configs_per_workload: int = 8,
                     log: Any = sys.stderr) -> dict[str, Any]:
    """The noise study on every GPU of the cluster: the same subset measured `repeats` times per GPU (a fresh worker
    process each time). Rows go to the store's replicas table (run "noise:<start time>:<repeat>"); returns
    {"within_gpu": per GPU the CV across its repeats, "across_gpus": storetools.gpu_comparison of the run}."""
    import statistics

    from kernel_gym.measure.storetools import gpu_comparison, put_replicas, replica_rows

    farm = farm or FarmOptions()
    from kernel_gym.measure.worker import resolve_family

    ref_of = {resolve_family(ref).name: ref for ref in opts.kernels}  # stored kernel name -> family reference
    items = [(ref_of.get(k, k), w, c) for k, w, c in noise_items(opts.db, workloads_per_kernel, configs_per_workload,
                                                                  opts.seed)]
    if not items:
        raise SystemExit(f"noise study: no successful measurements in {opts.db}; collect first")
    kernels = sorted({k for k, _, _ in items})
    opts = CollectOptions(**{**opts.__dict__, "kernels": kernels})
    started = connect(farm, opts.device, opts.gpus)
    f = Farm(opts, farm, log)
    store = MeasurementStore(opts.db)
    t0 = time.time()
    try:
        f.start_actors()
        refs = [s.actor.noise.remote(items, repeats) for s in f.slots]
        sent = {(w, c) for _, w, cs in items for c in cs}
        within: dict[str, Any] = {}
        for slot, ref in zip(f.slots, refs):
            runs = f.ray.get(ref)
            ctxs = {Context(**c).kernel: Context(**c) for c in slot.info["contexts"].values()}
            times: dict[tuple[str, str, str], list[float]] = {}
            for r, run in enumerate(runs if isinstance(runs, list) else []):
                by_kernel: dict[str, list[Measurement]] = {}
                kept, rejected = [], 0
                for m in run if isinstance(run, list) else []:  # only what was sent, with plausible times
                    if (not isinstance(m, Measurement) or (m.workload, m.config) not in sent
                            or not _plausible(m, slot.label)):
                        rejected += 1
                        continue
                    kept.append(m)
                if rejected:
                    print(f"[farm noise] {slot.label}: {rejected} results rejected (not sent, or implausible)",
                          file=sys.stderr, flush=True)
                for m in kept:
                    by_kernel.setdefault(m.kernel, []).append(m)
                    if m.status == OK and m.median_ms:
                        times.setdefault((m.kernel, m.workload, m.config), []).append(m.median_ms)
                for kernel, ms in by_kernel.items():
                    put_replicas(store, ctxs[kernel], ms, slot.origin, f"noise:{t0:.0f}:{r}")
            cvs = [statistics.pstdev(v) / statistics.fmean(v) for v in times.values() if len(v) == repeats > 1]
            within[slot.label] = {"keys": len(times), "cv_median": statistics.median(cvs) if cvs else None}
            print(f"[farm noise] {slot.label}: {repeats} repeats of {sum(len(c) for _, _, c in items)} "
                  f"measurements", file=log)
        run_rows = [r for r in replica_rows(store.conn) if r["run"].startswith(f"noise:{t0:.0f}:")]
        return {"repeats": repeats, "workloads": len(items), "gpus": [s.label for s in f.slots],
                "within_gpu": within, "across_gpus": gpu_comparison(run_rows)}
    finally:
        f.close()
        store.close()
        if started:
            f.ray.shutdown()


def _plausible(m: Measurement, origin: str) -> bool:
    from kernel_gym.measure.store import check_row

    try:
        check_row(f"farm result from {origin}", "noise", m, strict=True)
    except ValueError:
        return False
    return not (m.status == OK and m.median_ms is None and m.source != "interpreter")  # the interpreter never times


def validate_results(item: PlanItem, ms: Any, origin: str) -> tuple[list[Measurement], list[str]]:
    """(the results to store, why each other one was refused): a result must be a Measurement of the chunk's
    workload and one of the configs sent, each config once, with a known status and a finite time no faster than
    the roofline floor (store.check_row). A worker (or anyone on the cluster) cannot write other rows."""
    from kernel_gym.measure.store import check_row

    if not isinstance(ms, list):
        return [], [f"the chunk's result is a {type(ms).__name__}, not a list of measurements"]
    sent, seen = set(item.configs), set()
    good, bad = [], []
    for m in ms:
        if not isinstance(m, Measurement):
            bad.append(f"a {type(m).__name__} is not a Measurement")
            continue
        if m.workload != item.workload_key or m.config not in sent or m.config in seen:
            bad.append(f"{m.config[:80]} at {m.workload[:80]} was not sent in this chunk (or came twice)")
            continue
        if ":" not in item.kernel and m.kernel != item.kernel:
            bad.append(f"kernel {m.kernel!r} is not the chunk's {item.kernel!r}")
            continue
        if m.status == OK and m.median_ms is None and m.source != "interpreter":  # the interpreter checks, never times
            bad.append(f"{m.config[:80]}: status ok without a time")
            continue
        try:
            check_row(f"farm result from {origin}", "chunk", m, strict=True)
        except ValueError as exc:
            bad.append(str(exc)[:300])
            continue
        seen.add(m.config)
        good.append(m)
    return good, bad
