"""TrainingSampler and EvaluationSampler: disjoint, rank-count independent, resumable, reproducible shards."""

from __future__ import annotations

import pytest

from dlscale.data.loading.sampler import EvaluationSampler, TrainingSampler

N = 37  # not a multiple of G: the tail of each shuffled epoch is dropped
G = 8


def shard_streams(num_shards: int, epoch: int = 0, start_step: int = 0, **kw) -> list[list[int]]:
    """The index stream of every rank of a launch with ``num_shards`` ranks."""
    streams = []
    for rank in range(num_shards):
        sampler = TrainingSampler(N, G, num_shards=num_shards, shard_id=rank, **kw)
        sampler.set_epoch(epoch, start_step=start_step)
        streams.append(list(sampler))
    return streams


def step_batches(stream: list[int], local_batch: int) -> list[list[int]]:
    return [stream[i : i + local_batch] for i in range(0, len(stream), local_batch)]


def global_batches(num_shards: int, epoch: int = 0, **kw) -> list[set[int]]:
    """Per step, the set of indices all ranks together read."""
    b = G // num_shards
    per_rank = [step_batches(stream, b) for stream in shard_streams(num_shards, epoch, **kw)]
    steps = {len(batches) for batches in per_rank}
    assert len(steps) == 1, "every rank must run the same number of steps"
    return [set().union(*(batches[s] for batches in per_rank)) for s in range(steps.pop())]


@pytest.mark.parametrize("num_shards", [1, 2, 4, 8])
def test_ranks_are_disjoint_and_cover_the_first_full_steps_of_the_order(num_shards: int) -> None:
    order = TrainingSampler(N, G, seed=3).epoch_order().tolist()
    streams = shard_streams(num_shards, seed=3)
    union = [i for stream in streams for i in stream]
    steps_per_epoch = N // G
    assert len(union) == len(set(union)), "ranks overlap"
    assert set(union) == set(order[: steps_per_epoch * G])
    assert len(union) == steps_per_epoch * G  # the N mod G last samples are dropped
    for stream in streams:
        assert len(stream) == steps_per_epoch * (G // num_shards)


@pytest.mark.parametrize("num_shards", [1, 2, 4])
def test_rank_slice_of_each_step(num_shards: int) -> None:
    b = G // num_shards
    for rank in range(num_shards):
        sampler = TrainingSampler(N, G, num_shards=num_shards, shard_id=rank, seed=11)
        sampler.set_epoch(2)
        order = sampler.epoch_order().tolist()
        for s, batch in enumerate(step_batches(list(sampler), b)):
            assert batch == order[s * G + rank * b : s * G + (rank + 1) * b]


def test_global_batch_is_independent_of_the_number_of_ranks() -> None:
    for epoch in (0, 1):
        one = global_batches(1, epoch, seed=5)
        assert len(one) == N // G
        assert global_batches(2, epoch, seed=5) == one
        assert global_batches(4, epoch, seed=5) == one
        assert all(len(batch) == G for batch in one)


@pytest.mark.parametrize("num_shards", [1, 2, 4])
@pytest.mark.parametrize("start_step", [0, 1, 3, 4])
def test_resume_yields_the_tail_of_the_full_epoch(num_shards: int, start_step: int) -> None:
    b = G // num_shards
    full = shard_streams(num_shards, epoch=7, seed=2)
    resumed = shard_streams(num_shards, epoch=7, start_step=start_step, seed=2)
    for rank in range(num_shards):
        assert resumed[rank] == full[rank][start_step * b :]


def test_len_matches_iteration() -> None:
    for num_shards in (1, 2, 4):
        for start_step in (0, 2, N // G):
            sampler = TrainingSampler(N, G, num_shards=num_shards, shard_id=num_shards - 1)
            sampler.set_epoch(1, start_step=start_step)
            assert len(sampler) == len(list(sampler))
    assert len(TrainingSampler(5, G)) == 0 == len(list(TrainingSampler(5, G)))


def test_epoch_and_seed_change_the_order_reproducibly() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        sampler = TrainingSampler(N, G, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(0, 0) == order(0, 0)
    assert order(4, 3) == order(4, 3)
    assert order(0, 0) != order(0, 1)
    assert order(0, 1) != order(0, 2)
    assert order(0, 0) != order(1, 0)
    # A fresh sampler object draws the same order as one that went through other epochs first.
    sampler = TrainingSampler(N, G, seed=4)
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        list(sampler)
    sampler.set_epoch(3)
    assert list(sampler) == order(4, 3)
    assert sorted(TrainingSampler(N, G, seed=9).epoch_order().tolist()) == list(range(N))


def test_no_shuffle_reads_in_order() -> None:
    for epoch in (0, 5):
        streams = shard_streams(2, epoch=epoch, shuffle=False)
        assert sorted(streams[0] + streams[1]) == list(range((N // G) * G))
        assert streams[0][:4] == [0, 1, 2, 3] and streams[1][:4] == [4, 5, 6, 7]
        assert streams[0][4:8] == [8, 9, 10, 11]


@pytest.mark.parametrize(
    ("num_shards", "shard_id"),
    [(3, 0), (2, 2), (2, -1), (1, 1)],
    ids=["indivisible", "id=R", "id<0", "id=1/1"],
)
def test_bad_shards_raise(num_shards: int, shard_id: int) -> None:
    with pytest.raises(ValueError, match="divisible|shard_id"):
        TrainingSampler(N, G, num_shards=num_shards, shard_id=shard_id)


@pytest.mark.parametrize("start_step", [-1, N // G + 1])
def test_bad_start_step_raises(start_step: int) -> None:
    sampler = TrainingSampler(N, G)
    with pytest.raises(ValueError, match="start_step"):
        sampler.set_epoch(0, start_step=start_step)


@pytest.mark.parametrize(("num_samples", "num_shards"), [(10, 3), (10, 1), (2, 3), (12, 4)])
def test_evaluation_covers_every_sample_exactly_once(num_samples: int, num_shards: int) -> None:
    samplers = [EvaluationSampler(num_samples, num_shards, rank) for rank in range(num_shards)]
    streams = [list(sampler) for sampler in samplers]
    union = sorted(i for stream in streams for i in stream)
    assert union == list(range(num_samples))  # nothing dropped, nothing padded, no duplicates
    for rank, (sampler, stream) in enumerate(zip(samplers, streams, strict=True)):
        assert len(sampler) == len(stream)
        assert stream == sorted(stream)
        assert all(i % num_shards == rank for i in stream)
    if (num_samples, num_shards) == (10, 3):
        assert [len(stream) for stream in streams] == [4, 3, 3]  # uneven, not padded to 4
