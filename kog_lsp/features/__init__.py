"""Feature modules: each exposes register(ls) and keeps its handlers thin (see server.FEATURE_MODULES)."""
