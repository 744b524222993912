"""kog-lsp inference engine: token ids in, tokens out (see docs/interfaces.md)."""
from .config import PRESETS, ModelConfig, preset
from .engine import Engine, GenerationResult, ScoreResult, TokenEvent
from .sampling import SamplingParams
from .tokenizer import FimTokens, StreamDecoder, Tokenizer
from .worker import EngineWorker, Job, JobCancelled, Priority

__all__ = ["Engine", "GenerationResult", "ScoreResult", "TokenEvent", "SamplingParams", "ModelConfig", "PRESETS",
           "preset", "Tokenizer", "FimTokens", "StreamDecoder", "EngineWorker", "Job", "JobCancelled", "Priority"]
