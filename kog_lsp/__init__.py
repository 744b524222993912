"""kog-lsp: a language server for real-time inline code suggestions from an in-process LLM engine.

The server never imports torch: every model operation goes through `engine` (Engine + EngineWorker).
"""

__version__ = "0.1.0"
