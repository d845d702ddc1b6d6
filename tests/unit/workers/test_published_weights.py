"""The fleet's published weights (``reasonrl.workers.published_weights``): tensors of any dtype as bytes, back
unchanged, and read from Ray's object store without a copy."""
from __future__ import annotations

import pytest
import torch

from reasonrl.workers.host_memory import HostArena
from reasonrl.workers.published_weights import pack, put, staged_bytes, unpack


def _named():
    bf16 = torch.tensor([[1.5, -2.0, 3.25], [0.0, 7.0, -0.5]], dtype=torch.bfloat16)
    fp32 = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    return [("a.weight", bf16), ("b.weight", fp32), ("scale", torch.tensor(2.0)), ("empty", torch.zeros(0, 3))]


def test_tensors_come_back_with_their_names_dtypes_shapes_and_values():
    named = _named()
    published = pack(named)
    # bytes by hand: 6 bf16 x 2 + 12 fp32 x 4 + 1 fp32 x 4 + 0 = 12 + 48 + 4 = 64
    assert published.nbytes == 64
    back = unpack(published)
    assert [n for n, _ in back] == ["a.weight", "b.weight", "scale", "empty"]
    for (_, want), (_, got) in zip(named, back):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
    assert back[1][1].tolist() == [[0.0, 4.0, 8.0], [1.0, 5.0, 9.0], [2.0, 6.0, 10.0], [3.0, 7.0, 11.0]]


def test_the_packed_bytes_are_copies_and_unpacked_tensors_views_of_them():
    named = _named()
    published = pack(named)
    named[0][1].fill_(9.0)  # the actor trains on: the published version must not move
    assert unpack(published)[0][1][0, 0].item() == 1.5
    first = unpack(published)[0][1]
    assert first.data_ptr() == published.data[0].ctypes.data  # a view, not a copy


def test_the_arena_is_sized_by_hand_and_holds_every_copy_reused_by_the_next_publish():
    named = _named()
    need = staged_bytes([(t.shape, t.dtype) for _, t in named])
    assert need == 512 + 512 + 512 + 0  # 12, 48 and 4 bytes each take one 512-byte aligned slot; the empty none
    arena = HostArena("test")
    arena.begin(need)
    first = pack(named, arena)
    base = arena._buffer.data_ptr()
    starts = [a.ctypes.data - base for a in first.data if a.size]
    assert starts == [0, 512, 1024] and arena.misses == 0
    back = unpack(first)
    for (_, want), (_, got) in zip(named, back):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    named[0][1].fill_(9.0)  # trained on; the next publish writes the same memory
    arena.begin(need)
    second = pack(named, arena)
    assert [a.ctypes.data - base for a in second.data if a.size] == starts
    assert unpack(second)[0][1].unique().tolist() == [9.0]


def test_a_tensor_the_arena_cannot_hold_gets_a_copy_of_its_own():
    named = _named()
    arena = HostArena("test")
    arena.begin(512)  # room for the first tensor only
    published = pack(named, arena)
    assert arena.misses == 2  # b.weight and scale; the empty tensor needs no room
    base = arena._buffer.data_ptr()
    assert published.data[0].ctypes.data == base and not base <= published.data[1].ctypes.data < base + 512
    assert all(torch.equal(got, want) for (_, got), (_, want) in zip(unpack(published), named))


@pytest.mark.slow
def test_through_the_object_store_the_replica_reads_without_a_copy(ray_session):
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False,  # its own cluster: a bare init joins
             namespace="published-weights-test")  # the one ray_current_cluster names, if alive
    sent = put(_named())  # as actor rank 0's gather_weights returns it
    assert sent["bytes"] == 64
    got = ray.get(sent["ref"][0])
    # out of band: each array maps the store's shared memory, read-only, instead of an unpickled private copy
    assert all(not a.flags.writeable for a in got.data if a.size)
    assert torch.equal(unpack(got)[0][1], _named()[0][1])
    # through an arena: the store keeps its copy when the next publish writes the arena again
    named = _named()
    arena = HostArena("test")
    arena.begin(staged_bytes([(t.shape, t.dtype) for _, t in named]))
    sent = put(named, arena)
    assert sent["bytes"] == 64 and sent["copy_s"] >= 0 and sent["put_s"] >= 0
    named[0][1].fill_(9.0)
    arena.begin(arena.capacity)
    assert unpack(pack(named, arena))[0][1][0, 0].item() == 9.0  # the arena now holds the trained value
    assert unpack(ray.get(sent["ref"][0]))[0][1][0, 0].item() == 1.5

