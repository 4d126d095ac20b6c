"""collect --ray (issue 25 item 2): a local cluster listens on 127.0.0.1 with Ray's token authentication, an
older Ray is refused without --allow-open-cluster, and the driver stores only results for what it sent, with
plausible times. Runs without Ray: a stand-in records what ray.init was asked."""

from __future__ import annotations

import os

import pytest

from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure import farm
from kernel_gym.measure.collect import PlanItem
from kernel_gym.measure.types import CRASH, OK, Measurement


class FakeRay:
    def __init__(self, version: str) -> None:
        self.__version__ = version
        self.calls: list[dict] = []
        self.env_at_init: str | None = None

    def is_initialized(self) -> bool:
        return False

    def init(self, **kw) -> None:
        self.calls.append(kw)
        self.env_at_init = os.environ.get("RAY_AUTH_MODE")


@pytest.fixture
def fake(monkeypatch):
    def make(version: str) -> FakeRay:
        ray = FakeRay(version)
        monkeypatch.setattr(farm, "require_ray", lambda: ray)
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        return ray

    return make


def test_a_local_cluster_binds_to_localhost_with_token_auth(fake):
    ray = fake("2.52.1")
    assert farm.connect(farm.FarmOptions(), "cuda", 1) is True
    (kw,) = ray.calls
    assert kw["address"] == "local" and kw["_node_ip_address"] == "127.0.0.1" and kw["include_dashboard"] is False
    assert ray.env_at_init == "token"


def test_an_old_ray_is_refused_unless_the_open_cluster_is_asked_for(fake):
    ray = fake("2.40.0")
    with pytest.raises(ValueError, match="no token authentication .*--allow-open-cluster"):
        farm.connect(farm.FarmOptions(), "cuda", 1)
    assert not ray.calls
    assert farm.connect(farm.FarmOptions(allow_open_cluster=True), "cuda", 1)
    assert ray.calls[0]["_node_ip_address"] == "127.0.0.1" and ray.env_at_init is None


def test_joining_an_address_warns_without_a_token(fake, capsys):
    ray = fake("2.52.0")
    farm.connect(farm.FarmOptions(address="10.0.0.1:6379"), "cuda", 1)
    assert ray.calls[0]["address"] == "10.0.0.1:6379" and "_node_ip_address" not in ray.calls[0]
    assert "without token authentication" in capsys.readouterr().err


WL = MoEWorkload(256, 8, 2, 4096, 14336).key()
SENT = ('{"BLOCK_M":16}', '{"BLOCK_M":64}')
ITEM = PlanItem("fused_moe", WL, SENT, "eval")


def m(config: str = SENT[0], ms: float | None = 1.0, status: str = OK, workload: str = WL) -> Measurement:
    return Measurement("fused_moe", workload, config, status, median_ms=ms, spread=0.01, repeats=3)


def test_the_driver_keeps_only_what_it_sent_with_plausible_times():
    good, bad = farm.validate_results(ITEM, [m(), m(SENT[1], None, CRASH)], "h:gpu0")
    assert [x.config for x in good] == list(SENT) and not bad
    crafted = [m(), m('{"BLOCK_M":128}'), m(SENT[1], 0.001), m(SENT[1], float("nan")), m(SENT[0]),
               m(workload=MoEWorkload(1, 8, 2, 4096, 14336).key()), "not a measurement", m(SENT[1], None)]
    good, bad = farm.validate_results(ITEM, crafted, "h:gpu0")
    assert [x.config for x in good] == [SENT[0]] and len(bad) == 7
    assert any("below 0.5 x the workload's roofline" in b for b in bad)
    assert any("not a plausible kernel time" in b for b in bad)
    assert farm.validate_results(ITEM, {"rows": []}, "h:gpu0") == ([], ["the chunk's result is a dict, not a "
                                                                        "list of measurements"])
