"""Typed config, presets and key=value overrides."""
from .load import ConfigError, from_dict, load_config, to_dict, to_yaml, validate
from .schema import (ActorConfig, AlgorithmConfig, Config, CriticConfig, DataConfig, EvalConfig, ModelConfig,
                     RefConfig, RewardConfig, RolloutConfig, TrainerConfig)

__all__ = ["ConfigError", "load_config", "to_dict", "to_yaml", "from_dict", "validate", "Config", "ModelConfig",
           "DataConfig", "RolloutConfig", "ActorConfig", "AlgorithmConfig", "CriticConfig", "RefConfig", "RewardConfig",
           "TrainerConfig", "EvalConfig"]
