"""The dp x tp x cp mesh as rank arithmetic: groups, order, errors, and the layout table."""

from __future__ import annotations

import pytest

from dlscale.errors import ConfigError
from dlscale.parallel.collectives import split_sizes
from dlscale.parallel.mesh import MeshShape, layout_table


def test_first_name_of_the_order_gets_adjacent_ranks():
    shape = MeshShape.for_world(8, tensor_parallel=4, context_parallel=1, order="tp-dp-cp")
    assert shape.dp == 2
    assert shape.groups("tp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert shape.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    flipped = MeshShape.for_world(8, tensor_parallel=4, context_parallel=1, order="dp-tp-cp")
    assert flipped.groups("dp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert flipped.groups("tp") == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_the_tutorial_notebook_layout():
    # tp=2, cp=2, dp=8 with tp first, then cp: 4 dp groups of 8 ranks, 4 apart.
    shape = MeshShape.for_world(32, 2, 2, "tp-cp-dp")
    assert shape.groups("dp") == [list(range(start, 32, 4)) for start in range(4)]
    assert shape.groups("tp")[:2] == [[0, 1], [2, 3]]
    assert shape.groups("cp")[:2] == [[0, 2], [1, 3]]


@pytest.mark.parametrize("order", ["tp-cp-dp", "cp-tp-dp", "dp-cp-tp", "cp-dp-tp"])
def test_groups_partition_the_ranks_and_coordinates_round_trip(order):
    shape = MeshShape.for_world(24, 2, 3, order)
    for name in ("tp", "cp", "dp", "dp-cp", "tp-cp"):
        groups = shape.groups(name)
        assert sorted(rank for group in groups for rank in group) == list(range(24))
        assert all(len(group) == shape.size(name) for group in groups)
    for rank in range(24):
        coords = shape.coordinates(rank)
        assert shape.rank_at(coords) == rank
        # The ranks of one cp group share tp and dp and hold cp chunks 0, 1, 2 in order.
        members = shape.group_of("cp", rank)
        assert [shape.coordinates(r)["cp"] for r in members] == [0, 1, 2]
        assert {(shape.coordinates(r)["tp"], shape.coordinates(r)["dp"]) for r in members} == {
            (coords["tp"], coords["dp"])
        }
        # One model replica (tp-cp) holds every tp x cp position once, all with the same dp index.
        replica = shape.group_of("tp-cp", rank)
        assert {shape.coordinates(r)["dp"] for r in replica} == {coords["dp"]}
        assert len({(shape.coordinates(r)["tp"], shape.coordinates(r)["cp"]) for r in replica}) == 6


@pytest.mark.parametrize(
    ("world", "tp", "cp", "order", "fragments"),
    [
        (6, 4, 1, "tp-cp-dp", ["6 rank(s)", "4 x 1 = 4", "multiple of 4"]),
        (8, 3, 1, "tp-cp-dp", ["8 rank(s)", "3 x 1 = 3"]),
        (4, 2, 2, "tp-dp", ["parallel.parallel_order", "'tp-dp'"]),
        (4, 2, 2, "tp-tp-dp", ["parallel.parallel_order"]),
        (4, 0, 1, "tp-cp-dp", ["parallel.tensor_parallel", "got 0"]),
    ],
)
def test_sizes_that_do_not_fit_are_refused_with_the_numbers(world, tp, cp, order, fragments):
    with pytest.raises(ConfigError) as error:
        MeshShape.for_world(world, tp, cp, order)
    for fragment in fragments:
        assert fragment in str(error.value)


def test_layout_table_lists_every_rank_and_group():
    shape = MeshShape.for_world(4, 2, 1, "tp-cp-dp")
    lines = layout_table(shape, [10, 10, 10, 10])
    assert lines[0].startswith("Parallel layout: dp=2 x tp=2 x cp=1")
    assert sum(1 for line in lines if line.strip().startswith(("0 ", "1 ", "2 ", "3 "))) == 4
    assert "  tp groups: {0,1} {2,3}" in lines
    assert "  dp groups: {0,2} {1,3}" in lines
    assert not any(line.startswith("  cp groups") for line in lines)  # cp has size 1: no groups to list


def test_split_sizes_are_balanced_and_refuse_empty_chunks():
    assert split_sizes(4050, 4) == [1013, 1013, 1012, 1012]
    assert split_sizes(4050, 2) == [2025, 2025]
    assert split_sizes(7, 7) == [1] * 7
    with pytest.raises(ValueError, match="3 items over 4"):
        split_sizes(3, 4)
