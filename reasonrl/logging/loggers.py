"""Loggers chosen by ``trainer.logger``: console, jsonl, tensorboard, wandb.

Metric keys the console line shows (the trainer should use these names):

    reward/mean, reward/accuracy, response_length/mean, actor/kl, actor/entropy, timing_s/step,
    perf/tokens_per_s (tokens processed per second of step time), and any val/**accuracy.

Every backend receives every metric. JSONL always writes ``<run_dir>/metrics.jsonl`` (one object per step,
``"step"`` included) and ``log_samples`` always appends to ``<run_dir>/samples.jsonl``. TensorBoard and W&B
are optional packages: asking for one that is not installed fails at construction with the fix. A backend that
fails later (a W&B service crash, say) is dropped with a warning and never stops training.
"""
from __future__ import annotations

import json
import math
import netrc
import os
import socket
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple
from urllib.parse import urlparse

from reasonrl.config.load import ConfigError
from reasonrl.registry import Registry

from .sample_log import SAMPLE_LOG, VAL_SAMPLE_LOG


# (label, keys tried in order, format) for the one-line console summary.
CONSOLE_COLUMNS: Tuple[Tuple[str, Tuple[str, ...], str], ...] = (
    ("reward", ("reward/mean",), "{:.3f}"),
    ("acc", ("reward/accuracy",), "{:.3f}"),
    ("len", ("response_length/mean",), "{:.0f}"),
    ("kl", ("actor/kl",), "{:.3g}"),
    ("ent", ("actor/entropy",), "{:.3f}"),
    ("time", ("timing_s/step",), "{:.1f}s"),
    ("tok/s", ("perf/tokens_per_s", "perf/throughput"), "{:.0f}"),
)


class LoggerUnavailable(RuntimeError):
    """A logger was requested whose package is missing or cannot start."""


def to_jsonable(value: Any) -> Any:
    """Plain JSON values: tensors/numpy scalars become numbers, NaN/inf become None, unknown objects str()."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return to_jsonable(item())
        except (ValueError, RuntimeError):  # a tensor/array with more than one element
            tolist = getattr(value, "tolist", None)
            return to_jsonable(tolist()) if callable(tolist) else str(value)
    return str(value)


def numeric_items(metrics: Dict[str, Any]) -> Dict[str, float]:
    """The metrics that are finite numbers (bools excluded), as floats."""
    out = {}
    for key, value in metrics.items():
        value = to_jsonable(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    return out


class ConsoleLogger:
    """One concise line per step with the handful of numbers people watch."""

    name = "console"
    essential = True

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    def format_line(self, metrics: Dict[str, Any], step: int) -> str:
        """``step 3 | reward 0.250 | acc 0.250 | len 97 | kl 0.00123 | ent 1.234 | time 12.3s | tok/s 456``."""
        values = numeric_items(metrics)
        parts = [f"step {step}"]
        for label, keys, fmt in CONSOLE_COLUMNS:
            key = next((k for k in keys if k in values), None)
            if key is not None:
                parts.append(f"{label} {fmt.format(values[key])}")
        for key in sorted(values):
            if key.startswith("val/") and key.endswith("accuracy"):
                parts.append(f"{key} {values[key]:.3f}")
        return " | ".join(parts)

    def _write(self, line: str) -> None:
        try:  # keeps a running tqdm progress bar intact
            from tqdm import tqdm

            tqdm.write(line, file=self.stream)
            self.stream.flush()
        except ImportError:
            print(line, file=self.stream, flush=True)

    def log(self, metrics: Dict[str, Any], step: int) -> None:
        self._write(self.format_line(metrics, step))

    def log_samples(self, rows: List[Dict[str, Any]], step: int) -> None:
        if not rows:
            return
        row = rows[0]
        response = str(row.get("response", "")).replace("\n", " ")
        if len(response) > 160:
            response = response[:160] + "..."
        self._write(f"  sample 1/{len(rows)} @ step {step}: reward={row.get('reward')} reason={row.get('reason')!r} "
                    f"response={response!r}")

    def close(self) -> None:
        pass


class JsonlLogger:
    """Appends one JSON object per step to ``<run_dir>/metrics.jsonl`` (flushed every line)."""

    name = "jsonl"
    essential = True

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: Dict[str, Any], step: int) -> None:
        record = {"step": int(step)}
        record.update({k: to_jsonable(v) for k, v in metrics.items() if k != "step"})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_samples(self, rows: List[Dict[str, Any]], step: int) -> None:
        pass  # RunLogger writes samples.jsonl itself

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _markdown_table(rows: List[Dict[str, Any]], columns: Sequence[str], max_chars: int = 2000) -> str:
    def cell(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(to_jsonable(value))
        if len(text) > max_chars:
            text = text[:max_chars] + "..."
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


SAMPLE_COLUMNS = ("prompt", "response", "reward", "reason")


class TensorBoardLogger:
    """Scalars and sample tables (as markdown text) into ``<run_dir>/tensorboard``."""

    name = "tensorboard"
    essential = False

    def __init__(self, run_dir: Path, config_dict: Dict[str, Any]) -> None:
        try:
            import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise LoggerUnavailable(
                "trainer.logger includes 'tensorboard' but it cannot be imported "
                f"({exc}). Fix: pip install tensorboard, or drop it: trainer.logger=[console,jsonl]") from None
        self.log_dir = Path(run_dir) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=10)
        self.writer.add_text("config", "```\n" + json.dumps(to_jsonable(config_dict), indent=2) + "\n```", 0)

    def log(self, metrics: Dict[str, Any], step: int) -> None:
        for key, value in numeric_items(metrics).items():
            self.writer.add_scalar(key, value, step)

    def log_samples(self, rows: List[Dict[str, Any]], step: int) -> None:
        self.writer.add_text("samples", _markdown_table(rows, SAMPLE_COLUMNS), step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def _wandb_host() -> str:
    return urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"


def _has_wandb_key(host: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def choose_wandb_mode(timeout_s: float = 2.0) -> Tuple[str, str]:
    """(mode, why): WANDB_MODE if set; offline without an API key or without a route to the W&B host."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], "WANDB_MODE is set"
    host = _wandb_host()
    if not _has_wandb_key(host):
        return "offline", "no W&B API key (WANDB_API_KEY or ~/.netrc)"
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
    except OSError as exc:
        return "offline", f"{host}:443 unreachable ({exc.__class__.__name__})"
    return "online", "API key and network found"


class WandbLogger:
    """Weights & Biases; offline (synced later with ``wandb sync``) when there is no key or no network."""

    name = "wandb"
    essential = False

    def __init__(self, run_dir: Path, config_dict: Dict[str, Any], project: str, experiment: str) -> None:
        try:
            import wandb
        except ImportError:
            raise LoggerUnavailable("trainer.logger includes 'wandb' but wandb is not installed. "
                                    "Fix: pip install wandb, or drop it: trainer.logger=[console,jsonl]") from None
        self._wandb = wandb
        self.mode, self.why = choose_wandb_mode()
        kwargs = dict(project=project, name=experiment, dir=str(run_dir), config=to_jsonable(config_dict),
                      settings=wandb.Settings(init_timeout=60, silent=True))
        try:
            self.run = wandb.init(mode=self.mode, **kwargs)
        except Exception as exc:  # noqa: BLE001  (any online failure: fall back rather than stop the run)
            if self.mode != "online":
                raise LoggerUnavailable(f"wandb.init failed in {self.mode} mode: {exc}") from exc
            self.mode, self.why = "offline", f"online init failed ({exc.__class__.__name__})"
            self.run = wandb.init(mode="offline", **kwargs)
        if self.mode == "offline":
            print(f"wandb: offline ({self.why}); upload later with: wandb sync {self.run.dir.rsplit('/files', 1)[0]}",
                  file=sys.stderr)

    def log(self, metrics: Dict[str, Any], step: int) -> None:
        self.run.log(numeric_items(metrics), step=step)

    def log_samples(self, rows: List[Dict[str, Any]], step: int) -> None:
        def cell(value: Any) -> Any:
            value = to_jsonable(value)
            return value if isinstance(value, (str, int, float)) or value is None else json.dumps(value)

        columns = ["step", *SAMPLE_COLUMNS]
        data = [[step] + [cell(row.get(c)) for c in SAMPLE_COLUMNS] for row in rows]
        self.run.log({"samples": self._wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self.run.finish()


def _append_rows(path: Path, rows: List[Dict[str, Any]], step: int) -> None:
    """One JSON line per row, ``step`` first."""
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"step": int(step), **to_jsonable(dict(row))}) + "\n")


class RunLogger:
    """Fans metrics and samples out to the chosen backends; also owns ``<run_dir>/samples.jsonl``."""

    def __init__(self, backends: List[Any], run_dir: Path) -> None:
        self.backends = list(backends)
        self.run_dir = Path(run_dir)
        self.samples_path = self.run_dir / SAMPLE_LOG
        self._closed = False

    @property
    def names(self) -> List[str]:
        return [b.name for b in self.backends]

    def _each(self, method: str, *args: Any) -> None:
        for backend in list(self.backends):
            try:
                getattr(backend, method)(*args)
            except Exception as exc:  # noqa: BLE001
                if backend.essential:
                    raise
                warnings.warn(f"logger {backend.name!r} failed in {method} ({exc!r}); it is dropped for this run")
                self.backends.remove(backend)

    def log(self, metrics: Dict[str, float], step: int) -> None:
        """Record one step's metrics in every backend."""
        self._each("log", metrics, int(step))

    def log_samples(self, rows: List[Dict[str, Any]], step: int) -> None:
        """Append sample generations (prompt, response, reward, reason, ...) to samples.jsonl and tables."""
        _append_rows(self.samples_path, rows, step)
        self._each("log_samples", list(rows), int(step))

    def log_val_samples(self, rows: List[Dict[str, Any]], step: int) -> None:
        """Append held-out responses to val_samples.jsonl (``trainer.log_val_samples``; the file only)."""
        _append_rows(self.run_dir / VAL_SAMPLE_LOG, rows, step)

    def close(self) -> None:
        """Flush and close every backend (safe to call twice)."""
        if not self._closed:
            self._closed = True
            self._each("close")

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


LOGGERS = Registry("logger", config_key="trainer.logger")
"""Logger factories by name: ``(run_dir: Path, config_dict, project, experiment) -> backend``."""
LOGGERS.register("console", lambda path, config_dict, project, experiment: ConsoleLogger())
LOGGERS.register("jsonl", lambda path, config_dict, project, experiment: JsonlLogger(path))
LOGGERS.register("tensorboard", lambda path, config_dict, project, experiment: TensorBoardLogger(path, config_dict))
LOGGERS.register("wandb", WandbLogger)
LOGGER_NAMES: Tuple[str, ...] = tuple(LOGGERS)


def make_logger(names: Sequence[str], run_dir: str, config_dict: Dict[str, Any], project: str,
                experiment: str) -> RunLogger:
    """Build a RunLogger from ``trainer.logger`` names; unknown or unavailable loggers fail here, not mid-run."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    wanted: List[str] = []
    for name in names:
        name = name.strip().lower()
        if name not in LOGGER_NAMES:
            raise ConfigError(f"config key 'trainer.logger': unknown logger {name!r}; known: {', '.join(LOGGER_NAMES)}")
        if name not in wanted:
            wanted.append(name)
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    backends: List[Any] = []
    try:
        for name in wanted:
            backends.append(LOGGERS.build(name, path, config_dict, project, experiment))
    except BaseException:
        for backend in backends:
            backend.close()
        raise
    return RunLogger(backends, path)
