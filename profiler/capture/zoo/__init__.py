"""Built-in model zoo (small GPT-2 naive/native, LLaMA, BERT, ViT, CNN, MLP); see registry.py."""
from profiler.capture.zoo.registry import ZOO, ZooError, build_zoo, register_zoo, zoo_config, zoo_models

__all__ = ["ZOO", "ZooError", "build_zoo", "register_zoo", "zoo_config", "zoo_models"]
