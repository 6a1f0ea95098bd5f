"""The shared memory a worker and its engine send large tensors through (server/arena.py): regions are
handed out, held while any array over them lives on either side, and handed out again once both sides
let go; a tensor already in an arena crosses as a descriptor, without a copy; a full arena says so."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from tensorgate.codec.errors import ErrorKind, InferError
from tensorgate.server.arena import INLINE_MAX, MINE, YOURS, Arena, LinkArenas

MIB = 1 << 20


def pair(size: int = 4 * MIB) -> tuple[LinkArenas, LinkArenas, dict[str, list[int]]]:
    """Both ends of one link in this process: each maps the other's arena as the other process would.
    The releases each end sends wait in its outbox, as behind the messages it sent before them on the
    link, until `deliver` hands them over."""
    worker_arena, engine_arena = Arena(size), Arena(size)
    outbox: dict[str, list[int]] = {"worker": [], "engine": []}
    worker = LinkArenas(worker_arena, Arena(size, os.dup(engine_arena.fd)), outbox["worker"].append)
    engine = LinkArenas(engine_arena, Arena(size, os.dup(worker_arena.fd)), outbox["engine"].append)
    return worker, engine, outbox


def deliver(releases: list[int], to: LinkArenas) -> None:
    gc.collect()
    for offset in releases:
        to.mine.release(offset)
    releases.clear()


def test_a_region_is_handed_out_again_once_its_array_is_gone() -> None:
    arena = Arena(4 * MIB)
    first = arena.allocate(3 * MIB)
    with pytest.raises(InferError) as full:
        arena.allocate(2 * MIB)
    assert full.value.kind is ErrorKind.UNAVAILABLE  # would fit once the requests in flight are answered
    assert "--worker-arena-bytes" in full.value.message and str(2 * MIB) in full.value.message
    view = first[10:20].view(np.int8)
    del first
    gc.collect()
    with pytest.raises(InferError):  # a view of it still holds it
        arena.allocate(2 * MIB)
    del view
    gc.collect()
    assert arena.in_use == 0
    assert arena.allocate(4 * MIB).nbytes == 4 * MIB  # the freed spans merged back into one


def test_a_tensor_larger_than_the_arena_is_refused_as_too_large() -> None:
    with pytest.raises(InferError) as refused:
        Arena(MIB).allocate(2 * MIB)
    assert refused.value.kind is ErrorKind.RESOURCE_EXHAUSTED


def test_small_tensors_travel_inside_the_message() -> None:
    worker, _, _ = pair()
    assert worker.place(np.zeros(INLINE_MAX // 4 - 1, np.float32)) is None
    assert worker.place(np.zeros(INLINE_MAX // 4, np.float32)) is not None


def test_a_tensor_is_copied_once_and_held_until_the_reader_lets_go() -> None:
    worker, engine, outbox = pair()
    data = np.arange(MIB, dtype=np.float32)  # 4 MiB: the whole arena
    descriptor = worker.place(data)
    assert descriptor[0] == MINE
    received = engine.take(descriptor).view(np.float32)
    np.testing.assert_array_equal(received, data)
    received[0] = -1.0  # writable, as a tensor received in one process is
    deliver(outbox["engine"], worker)
    with pytest.raises(InferError):  # the engine's view holds the region
        worker.mine.allocate(MIB)
    del received
    deliver(outbox["engine"], worker)
    assert worker.mine.in_use == 0


def test_an_answer_over_the_askers_own_arena_goes_back_without_a_copy() -> None:
    worker, engine, outbox = pair()
    body = worker.mine.allocate(2 * MIB)  # a request body received into the worker's arena
    body[:] = 7
    request = engine.take(worker.place(body))
    del body
    answer = request.view(np.float32).reshape(2, -1)  # an identity model's output: a view of its input
    descriptor = engine.place(answer)  # the engine answers...
    assert descriptor[0] == YOURS and engine.mine.in_use == 0  # nothing copied into the engine's arena
    del request, answer
    gc.collect()
    assert outbox["engine"]  # ... and lets go of the request: a release behind the answer
    returned = worker.take(descriptor)  # the worker reads the answer first
    deliver(outbox["engine"], worker)
    assert worker.mine.in_use > 0 and (returned == 7).all() and returned.nbytes == 2 * MIB
    del returned
    gc.collect()
    assert worker.mine.in_use == 0
