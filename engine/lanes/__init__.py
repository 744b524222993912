"""Laneformer lanes (tp_mode='delayed'): config, single-device lane reference model, checkpoint loader.

The reference simulates every lane on one device; CPU tests in tests/lanes define the semantics a
multi-GPU delayed-TP engine must reproduce. Ambiguity defaults are documented in config.py
(A1 early_queue=True as in the verified remote code; A4 use_early_comm read from config.json).
"""

from .config import LaneConfig, LaneConfigError, ReduceMode, rope_frequencies
from .loader import (LaneCheckpointError, TPModeError, check_tp_mode, check_weights, checkpoint_kind,
                     expected_shapes, load_lane_checkpoint, read_tensors, to_dense_llama,
                     lane_shard, write_dense_llama_checkpoint)
from .model import LaneKVCache, LaneModel

__all__ = [
    "LaneConfig", "LaneConfigError", "ReduceMode", "rope_frequencies", "LaneCheckpointError",
    "TPModeError", "check_tp_mode", "check_weights", "checkpoint_kind", "expected_shapes",
    "load_lane_checkpoint", "read_tensors", "to_dense_llama", "write_dense_llama_checkpoint",
    "lane_shard", "LaneKVCache", "LaneModel",
]
