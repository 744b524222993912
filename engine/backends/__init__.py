"""Backend selection: monokernel (Hopper, supported model) -> graph (CUDA) -> reference, with reasons.

tp > 1 (or tp_mode "delayed") resolves "monokernel" to the tensor-parallel monokernel (tp_monokernel.py, one
persistent kernel per GPU); no other backend supports tp, so such a request either gets it or fails loudly.
A lane model (engine/lanes/serving.py) runs on that backend in delayed mode with tp = its lanes, or at tp=1 on the
reference backend (its forward simulates every lane); the graph backend refuses it.

Every backend class is built as `Cls(model, cache, tp=..., tp_mode=...)`, may raise BackendUnavailable (or any
exception) while building or in `warmup()`; the selector then falls back to the next one and keeps the reason.
"""
from __future__ import annotations

import importlib
import logging

import torch

from .base import Backend, BackendUnavailable
from .reference import ReferenceBackend

log = logging.getLogger("engine")

ORDER = ("monokernel", "graph", "reference")


def _load_class(name: str, tp: int = 1, tp_mode: str = "exact"):
    if name == "reference":
        return ReferenceBackend
    if name == "graph":
        from .graph import GraphBackend
        return GraphBackend
    if name == "monokernel":
        mod = importlib.import_module("engine.backends.monokernel")
        # The module picks its class for the request: the single-GPU kernel, or for tp > 1 / tp_mode "delayed"
        # the tensor-parallel one (engine/backends/tp_monokernel.py). A module without the chooser offers one class.
        pick = getattr(mod, "backend_class", None)
        return pick(tp, tp_mode) if pick is not None else mod.MonokernelBackend
    raise ValueError(f"unknown backend {name!r} (known: auto, {', '.join(ORDER)})")


def _is_lane(model) -> bool:
    """A Laneformer lane model (engine/lanes/serving.py LaneServingModel): served by the reference backend at
    tp=1 (all lanes simulated) or the tensor-parallel monokernel in delayed mode (one GPU per lane)."""
    return getattr(model, "checkpoint_kind", "dense") == "lane"


def _precheck(name: str, model) -> str | None:
    """Reason why `name` cannot run here, or None."""
    dev = model.device
    if name == "reference":
        return None
    if name == "graph" and _is_lane(model):
        return "graph runs ordinary checkpoints only (a lane model has no CUDA-graph decode step)"
    if dev.type != "cuda":
        return f"{name} needs CUDA (device is {dev.type})"
    if name == "monokernel":
        major, minor = torch.cuda.get_device_capability(dev)
        if major != 9:
            return f"monokernel needs compute capability 9.x (this GPU is {major}.{minor})"
    return None


class TPUnavailable(BackendUnavailable):
    """tp > 1 was asked for where it cannot run (no CUDA, too few GPUs, no tensor-parallel backend). Loading
    fails instead of silently running on one device."""


def check_tp(tp, tp_mode: str, device) -> None:
    """Refuse a tensor-parallel request this machine cannot serve, before any backend is built."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
    if tp_mode not in ("exact", "delayed"):
        raise ValueError(f"tp_mode must be 'exact' or 'delayed', not {tp_mode!r}")
    if tp == 1:
        return
    dev = torch.device(device)
    if dev.type != "cuda":
        raise TPUnavailable(f"tp={tp} needs {tp} CUDA GPUs, but the model device is {dev.type}"
                            + ("" if torch.cuda.is_available() else " (CUDA is not available here)")
                            + "; use tp=1 or device='cuda'")
    n = torch.cuda.device_count()
    if n < tp:
        raise TPUnavailable(f"tp={tp} needs {tp} CUDA GPUs; this machine has {n}")


def select_backend(requested: str, model, cache, tp: int = 1, tp_mode: str = "exact") -> tuple[Backend, str]:
    """Returns (backend, reason). `requested` is "auto" or a backend name; an explicit name that cannot run
    falls back down the ORDER chain like auto does, and the reason says why. tp > 1 or tp_mode 'delayed' only
    runs on a backend with `supports_tp`; without one (or without enough GPUs) this raises TPUnavailable."""
    if requested != "auto" and requested not in ORDER:
        raise ValueError(f"unknown backend {requested!r} (known: auto, {', '.join(ORDER)})")
    check_tp(tp, tp_mode, model.device)
    chain = ORDER if requested == "auto" else ORDER[ORDER.index(requested):]
    reasons: list[str] = []
    for name in chain:
        why = _precheck(name, model)
        cls = None
        if why is None:
            try:
                cls = _load_class(name, tp, tp_mode)
            except ImportError as e:
                why = f"{name} unavailable: {e}"
        if why is None and hasattr(cls, "supported"):
            try:
                ok, r = cls.supported(model.cfg, model.device)
            except Exception as e:  # a broken probe must not take the engine down
                ok, r = False, f"supported() raised {type(e).__name__}: {e}"
            if not ok:
                why = f"{name} unsupported: {r}"
        # The reference backend runs whatever model.forward computes: for a lane model at tp=1 that is every lane
        # simulated on one device, which is what tp_mode 'delayed' means there.
        lane_reference = name == "reference" and tp == 1 and _is_lane(model)
        if why is None and not lane_reference:
            if (tp != 1 or tp_mode != "exact") and not getattr(cls, "supports_tp", False):
                why = f"{name} does not support tp={tp} tp_mode={tp_mode}"
        if why is None:
            try:
                backend = cls(model, cache, tp=tp, tp_mode=tp_mode)
                warm = getattr(backend, "warmup", None)
                if warm is not None:
                    warm()
            except Exception as e:
                why = f"{name} failed to start: {type(e).__name__}: {e}"
                log.warning("backend %s failed, falling back: %s", name, why)
        if why is not None:
            reasons.append(why)
            log.info("backend %s skipped: %s", name, why)
            continue
        picked = "requested" if requested == name else "auto"
        reason = "; ".join(reasons + [f"{name} selected ({picked})"])
        log.info("backend: %s (%s)", name, reason)
        return backend, reason
    if tp != 1 or tp_mode != "exact":
        raise TPUnavailable(f"no backend can run tp={tp} tp_mode={tp_mode} (tensor-parallel decoding needs a "
                            f"backend with supports_tp; none started): " + "; ".join(reasons))
    raise RuntimeError("no backend could start: " + "; ".join(reasons))


__all__ = ["Backend", "BackendUnavailable", "ReferenceBackend", "TPUnavailable", "check_tp", "select_backend",
           "ORDER"]
