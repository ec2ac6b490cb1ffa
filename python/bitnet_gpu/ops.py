"""The element-wise, row and sampling ops in one namespace (bitnet_gpu.ops), as they are at the top
level: activations.py, norms.py, arithmetic.py and sampling.py hold them by family."""

from __future__ import annotations

from .activations import *  # noqa: F403
from .activations import __all__ as _activations
from .arithmetic import *  # noqa: F403
from .arithmetic import __all__ as _arithmetic
from .norms import layer_norm, rms_norm, softmax, softmax_backward  # noqa: F401
from .sampling import _sampling_params, sample_logits  # noqa: F401

__all__ = sorted(
    _activations
    + _arithmetic
    + ["layer_norm", "rms_norm", "softmax", "softmax_backward", "sample_logits"]
)
