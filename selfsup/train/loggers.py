"""Experiment loggers (``trainer.loggers``): ``metrics.csv``'s scalars, the resolved config and the run's pictures,
also sent to TensorBoard, Weights & Biases (offline) or MLflow (a local file store) through Lightning's loggers.

``csv`` is ``metrics.csv`` itself (:class:`selfsup.train.metrics_log.MetricsLog`), always written: plots, resume
and ``selfsup report`` read it. The others write inside the run directory (``tensorboard/``, ``wandb/``,
``mlruns/``) and a resumed run appends to the same logger run: the same TensorBoard log dir (events after the
checkpoint's step purged), the same W&B run id and the same MLflow run id, kept in ``loggers.json``. Only the main
process constructs loggers and logs (Lightning's loggers are rank-zero-only as well).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from selfsup.checkpoint import atomic_write
from selfsup.config import ConfigError, flatten

log = logging.getLogger("selfsup")

# logger name -> the module it needs (installed by the extra of the same name: pip install 'selfsup[NAME]')
LOGGERS = {"csv": None, "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
IDS_FILE = "loggers.json"


def check_loggers(names: list[str]) -> None:
    """``trainer.loggers``: known names whose package is installed (before any work)."""
    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"bad value for trainer.loggers: {name!r}; allowed values: {', '.join(LOGGERS)}")
        module = LOGGERS[name]
        if module is not None and importlib.util.find_spec(module) is None:
            raise ConfigError(f"trainer.loggers: {name} needs the {module} package, which is not installed: "
                              f"pip install 'selfsup[{name}]' (or remove {name} from trainer.loggers)")


class ExperimentLoggers:
    """The run's Lightning loggers other than ``csv`` (main process only; on other processes it does nothing)."""

    def __init__(self, names: list[str], run_dir: Path, start_step: int, is_main: bool) -> None:
        self.run_dir, self.start_step = run_dir, start_step
        self.loggers: dict[str, Any] = {}
        if not is_main:
            return
        self.ids_path = run_dir / IDS_FILE
        self.ids: dict[str, str] = json.loads(self.ids_path.read_text()) if self.ids_path.is_file() else {}
        for name in dict.fromkeys(names):
            if name != "csv":
                self.loggers[name] = getattr(self, f"_{name}")()
        self._save_ids()

    # --- construction, one method per logger ------------------------------------------------------------------
    def _tensorboard(self) -> Any:
        from lightning.fabric.loggers import TensorBoardLogger

        # One log dir for the run; a resume hides the events logged after the checkpoint it continues from.
        kwargs = {"purge_step": self.start_step + 1} if self.start_step > 0 else {}
        return TensorBoardLogger(root_dir=self.run_dir, name="tensorboard", version="", default_hp_metric=False,
                                 **kwargs)

    def _wandb(self) -> Any:
        import wandb
        from lightning.pytorch.loggers import WandbLogger

        run_id = self.ids.setdefault("wandb", uuid.uuid4().hex[:8])
        settings = wandb.Settings(mode="offline", silent=True, disable_git=True, save_code=False,
                                  x_disable_stats=True, x_disable_machine_info=True, console="off")
        return WandbLogger(save_dir=str(self.run_dir), offline=True, project="selfsup", name=self.run_dir.name,
                           id=run_id, resume="allow", settings=settings)

    def _mlflow(self) -> Any:
        # MLflow 3 keeps its file store only behind this opt-in (a database store needs the full mlflow package).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from lightning.pytorch.loggers import MLFlowLogger

        logger = MLFlowLogger(experiment_name="selfsup", run_name=self.run_dir.name,
                              tracking_uri=f"file:{(self.run_dir / 'mlruns').resolve()}", run_id=self.ids.get("mlflow"))
        if "mlflow" in self.ids:  # resumed: the run stopped as KILLED or FAILED runs again
            logger.experiment.update_run(logger.run_id, status="RUNNING")
        self.ids["mlflow"] = logger.run_id  # creates the run (or finds the stored one)
        return logger

    def _save_ids(self) -> None:
        if self.loggers and self.ids:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            text = json.dumps(self.ids, indent=2)
            atomic_write(self.ids_path, lambda tmp: Path(tmp).write_text(text))

    # --- what the run logs -----------------------------------------------------------------------------------------
    def log_hyperparams(self, config: dict[str, Any]) -> None:
        """The resolved config, flattened (``optim.lr``). MLflow's params cannot change, so a resume (whose accepted
        ``optim.*`` changes are in config_changes.log) does not send them again."""
        params = {key: value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
                  for key, value in flatten(config).items()}
        for name, logger in self.loggers.items():
            if name == "tensorboard":
                # Lightning's TensorBoardLogger writes hparams only with a metric (a made-up hp_metric scalar by
                # default); written here as it does, linked to the run's loss curve and no extra scalar.
                from torch.utils.tensorboard.summary import hparams

                for summary in hparams({k: v for k, v in params.items() if v is not None}, {"loss": 0.0}):
                    logger.experiment._get_file_writer().add_summary(summary, self.start_step)
            elif name != "mlflow" or self.start_step == 0:
                logger.log_hyperparams(params)

    def log_metrics(self, row: dict[str, Any]) -> None:
        """A ``metrics.csv`` row: its numbers, at its step."""
        if not self.loggers:
            return
        metrics = {k: float(v) for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        for logger in self.loggers.values():
            logger.log_metrics(metrics, step=int(row["step"]))

    def log_images(self, folder: Path, step: int) -> None:
        """The PNGs of ``folder`` (plots/), as images (TensorBoard, W&B) or artifacts (MLflow)."""
        pictures = sorted(folder.glob("*.png")) if self.loggers else []
        if not pictures:
            return
        for name, logger in self.loggers.items():
            if name == "tensorboard":
                import numpy as np
                from PIL import Image

                for path in pictures:
                    image = np.asarray(Image.open(path).convert("RGB"))
                    logger.experiment.add_image(f"plots/{path.stem}", image, global_step=step, dataformats="HWC")
            elif name == "wandb":
                for path in pictures:
                    logger.log_image(key=f"plots/{path.stem}", images=[str(path)], step=step)
            elif name == "mlflow":
                for path in pictures:
                    logger.experiment.log_artifact(logger.run_id, str(path), "plots")

    def flush(self) -> None:
        """On disk what was logged so far (with each checkpoint)."""
        if "tensorboard" in self.loggers:
            self.loggers["tensorboard"].experiment.flush()

    def finalize(self, status: str = "success") -> None:
        """Close the logger runs: ``success``, ``failed`` or ``KILLED`` (MLflow's run status; W&B's exit code)."""
        for logger in self.loggers.values():
            logger.finalize(status)
        if "wandb" in self.loggers:
            import wandb

            wandb.finish(exit_code=0 if status == "success" else 1)
        self.loggers = {}
