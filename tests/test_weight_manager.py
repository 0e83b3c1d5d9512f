"""Fast scaling's weight paths: a peer process copies a running instance's weights; disk is the
fallback when the peer fails (HyperFlexis §6)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

torch = pytest.importorskip("torch")

from hfx.model.shapes import get_shape  # noqa: E402
from hfx.model.weight_manager import (  # noqa: E402
    OffloadedWeights,
    PeerUnavailable,
    WeightManager,
    load_weights,
    receive,
)
from hfx.model.weights import empty_model, random_model, save_checkpoint  # noqa: E402


def _checksum_in_child(checkpoint: str, handle, out) -> None:
    model, path = load_weights(checkpoint, handle)
    out.put((path, {k: float(v.double().sum()) for k, v in model.state_dict().items()}))


def _checksums(model) -> dict[str, float]:
    return {k: float(v.double().sum()) for k, v in model.state_dict().items()}


@pytest.fixture
def source(tmp_path):
    model = random_model(get_shape("tiny"), seed=5)
    save_checkpoint(model, tmp_path)
    manager = WeightManager(model)
    yield model, manager, tmp_path
    manager.close()


def test_a_peer_process_copies_the_weights(source):
    model, manager, ckpt = source
    handle = manager.share()
    ctx = mp.get_context("spawn")  # a fresh interpreter: nothing inherited but the handle
    out = ctx.Queue()
    child = ctx.Process(target=_checksum_in_child, args=(str(ckpt), handle, out))
    child.start()
    path, sums = out.get(timeout=120)
    child.join(timeout=60)
    assert path == "d2d"
    assert sums == _checksums(model)


def test_falls_back_to_disk_when_the_peer_is_gone(source):
    model, manager, ckpt = source
    handle = manager.share()
    manager.close()
    loaded, path = load_weights(ckpt, handle)
    assert path == "disk"
    assert _checksums(loaded) == _checksums(model)


def test_a_peer_of_another_model_is_refused(source):
    _, manager, _ = source
    handle = manager.share()
    other = empty_model(get_shape("tiny", num_hidden_layers=3), torch.float32, "cpu")
    with pytest.raises(PeerUnavailable, match="missing"):
        receive(handle, other)


def test_offloaded_copy_restores_the_weights(source):
    model, _, _ = source
    offloaded = OffloadedWeights(model)
    fresh = empty_model(model.shape, torch.float32, "cpu")
    offloaded.restore(fresh)
    assert _checksums(fresh) == _checksums(model)
