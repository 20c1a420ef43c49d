"""``candle_ckpt.distributed.torch_rng``: the backend's own global RNG state, captured and restored."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from candle_ckpt.distributed import torch_rng

needs_torch = pytest.mark.needs_package("torch")


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_backends_without_a_global_generator_capture_and_restore_nothing(backend: str, monkeypatch) -> None:
    """JAX and TensorFlow have nothing here, while torch is not imported: capture is empty, restore sets nothing."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert torch_rng.backend_capture(backend) == {}
    assert torch_rng.backend_restore({torch_rng.TORCH_CPU_KEY: np.zeros(8, np.uint8)}, backend) == []


@needs_torch
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_torch_imported_under_another_backend_is_captured_and_restored(backend: str) -> None:
    """A torch DataLoader feeding fit on JAX or TensorFlow draws its shuffle from torch's generator: once torch is
    imported, its state is captured and restored on every backend."""
    import torch

    torch.manual_seed(7)
    state = torch_rng.backend_capture(backend)
    first = torch.randperm(64)  # what a RandomSampler draws from (its seed comes from the global generator)
    torch.manual_seed(8)
    assert torch_rng.backend_restore(state, backend) == ["torch_cpu"]
    assert torch.equal(torch.randperm(64), first)


@needs_torch
def test_torch_restore_replays_the_same_draws() -> None:
    """After restore, torch draws exactly the numbers it drew after capture, and capture draws nothing."""
    import torch

    torch.manual_seed(7)
    state = torch_rng.backend_capture("torch")
    assert set(state) >= {torch_rng.TORCH_CPU_KEY} and all(k.startswith("rng.torch.") for k in state)
    first = torch.rand(5)
    torch.manual_seed(8)
    assert torch_rng.backend_restore({**state, "rng.numpy.keys": np.zeros(3)}, "torch") == ["torch_cpu"]
    assert torch.equal(torch.rand(5), first)
    torch.manual_seed(7)
    assert torch.equal(torch.rand(5), first)  # capture itself did not advance the generator


@needs_torch
def test_torch_restore_rejects_a_state_that_is_not_uint8() -> None:
    """A state of the wrong dtype is refused, naming its key, before anything is set."""
    with pytest.raises(ValueError, match=r"rng\.torch\.cpu: a torch RNG state is a 1-D uint8 array; got float32"):
        torch_rng.backend_restore({torch_rng.TORCH_CPU_KEY: np.zeros(8, np.float32)}, "torch")


@needs_torch
def test_torch_restore_refuses_cuda_states_for_devices_this_process_lacks() -> None:
    """CUDA states of more devices than visible raise, naming how many were saved and seen."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a process without CUDA devices")
    state = {torch_rng.TORCH_CUDA_KEY.format(0): np.zeros(16, np.uint8)}
    with pytest.raises(ValueError, match=r"CUDA RNG states of 1 devices but this process sees 0"):
        torch_rng.backend_restore(state, "torch")
