"""A user's script as `mypy --strict` checks it (tests_py/test_typing.py): the public API is
annotated and re-exported explicitly, so strict mode finds nothing to flag."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import bitnet_gpu as bg
from bitnet_gpu.models import BitNetConfig, BitNetModel


def layer(x: npt.NDArray[np.float32], w: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    weights: bg.TernaryWeights = bg.quantize_weights(w)
    h = bg.rms_norm(x, np.ones(x.shape[-1], np.float32), 1e-6)
    y = bg.bitlinear(h, weights)
    return np.asarray(bg.softmax(bg.relu(y)), np.float32)


def on_device(device: bg.Device) -> bg.Tensor:
    t = bg.Tensor.from_numpy(np.ones(8, np.float32), device)
    result: bg.Tensor = bg.add(bg.gelu(t), 1.0)
    return result


def decode() -> str:
    model = BitNetModel.random(BitNetConfig.preset("tiny"), seed=1, max_tokens=64)
    ids = model.generate(np.array([[1, 2, 3]]), max_new_tokens=4)
    drawn = bg.sample_logits(np.zeros(16, np.float32), 0.8, top_k=4, seed=2)
    chol = bg.linalg.cholesky(np.eye(3, dtype=np.float32))
    total = bg.sum(bg.max(np.ones((2, 3), np.float32), axis=0))
    return f"{np.shape(ids)} {drawn} {np.shape(chol)} {total}"


if __name__ == "__main__":
    x = np.ones((2, 64), np.float32)
    print(layer(x, np.ones((32, 64), np.float32)).shape, on_device(bg.default_device()), decode())
