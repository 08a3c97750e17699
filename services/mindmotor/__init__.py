"""MindMotor: an open microservice platform for serving LLMs on (emulated) Ascend NPUs."""

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "EngineConfig", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import mindmotor` (the CLI, the trainer) stays cheap.
    if name == "LLM":
        from mindmotor.engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from mindmotor.rules.sampling_params import SamplingParams
        return SamplingParams
    if name == "EngineConfig":
        from mindmotor.engine.config import EngineConfig
        return EngineConfig
    raise AttributeError(f"module 'mindmotor' has no attribute {name!r}")
