"""Run loggers: console, JSONL, TensorBoard and W&B behind one ``RunLogger``.

    logger = make_logger(["console", "jsonl"], run_dir, config_dict, project="reasonrl", experiment="run")
    logger.log({"reward/mean": 0.5, "timing_s/step": 3.2}, step=1)
    logger.log_samples([{"prompt": ..., "response": ..., "reward": 1.0, "reason": "match"}], step=1)
    logger.close()
"""
from .loggers import (CONSOLE_COLUMNS, LOGGER_NAMES, ConsoleLogger, JsonlLogger, LoggerUnavailable, RunLogger,
                      TensorBoardLogger, WandbLogger, make_logger)

__all__ = ["CONSOLE_COLUMNS", "LOGGER_NAMES", "ConsoleLogger", "JsonlLogger", "LoggerUnavailable", "RunLogger",
           "TensorBoardLogger", "WandbLogger", "make_logger"]
