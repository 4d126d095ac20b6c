"""The coverage measure: distance from a MoE shape to the trained shapes, its percentile and the warning."""

from kernel_gym import zoo
from kernel_gym.dispatch.shape_coverage import Shape, coverage, trained_shapes


def test_a_trained_shape_is_covered_and_a_far_one_warns():
    trained = trained_shapes()
    assert {"design-00", "mixtral-8x7b"} <= {s.name for s in trained}
    inside = coverage(zoo.ZOO["mixtral-8x7b"], trained)
    assert inside.distance == 0.0 and inside.percentile == 0.0 and not inside.warn
    far = coverage(Shape("odd", 512, 10, 8192, 16384), trained)  # every axis at its top end at once
    assert far.distance > 0.3 and far.percentile > 90 and far.warn and "kernel-gym tune" in far.line()
    beyond = coverage(Shape("tiny", 4, 1, 512, 16), trained)
    assert set(beyond.outside) >= {"experts", "hidden", "intermediate"} and beyond.warn


def test_provenance_specs_decide_what_was_trained():
    """A policy whose provenance lists only Mixtral is far from a many-expert shape it would cover with the design."""
    prov = {"model_specs": repr([{**zoo.ZOO["mixtral-8x7b"].__dict__}])}
    only = trained_shapes(prov)
    assert [s.name for s in only] == ["mixtral-8x7b"]
    shape = Shape("many-small", 256, 8, 2048, 128)
    assert coverage(shape, only).distance > coverage(shape, trained_shapes()).distance
