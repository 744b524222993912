"""Tensor parallelism (issue #6, /work/shared/DTP.md): exact-mode sharding plans and a one-process emulation of
N-rank decoding in both modes (the specification the multi-GPU kernels are tested against)."""

from .emulate import DelayedTP, ExactTP, TPStep, greedy_exchange, ordered_sum
from .shard import RankShard, ShardError, TPPlan, make_plan, rank_layers, shard_weights, split_range

__all__ = ["DelayedTP", "ExactTP", "TPStep", "greedy_exchange", "ordered_sum", "RankShard", "ShardError",
           "TPPlan", "make_plan", "rank_layers", "shard_weights", "split_range"]
