"""The tasks a TrainingRun trains on: its source read, its filter applied, in curriculum order
(the trainer's :func:`load_tasks`, also what ``crl train --validate`` validates)."""

from __future__ import annotations

from crl_worker.errors import CrlError
from crl_worker.tasks.model import Task
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.settings import TrainSettings


def load_tasks(settings: TrainSettings) -> list[Task]:
    """The run's tasks (its source and filter), in curriculum order."""
    from crl_worker.tasks.sources import load_source
    from crl_worker.train.curriculum import order_tasks

    try:
        loaded = load_source(
            settings.spec.tasks,
            mounted_path=settings.tasks_file,
            base_dir=settings.config_path.parent,
        )
    except (CrlError, OSError, ValueError) as exc:
        raise TrainConfigError("spec.tasks", f"cannot read the tasks: {exc}") from exc
    if loaded.errors:
        shown = "; ".join(str(e) for e in loaded.errors[:5])
        raise TrainConfigError(
            "spec.tasks",
            f"{len(loaded.errors)} task record(s) are malformed ({shown}); check the file "
            "with `crl tasks check`",
        )
    curriculum = getattr(settings.spec, "curriculum", None)
    # `curriculum.results` is read where the spec's data paths are: in a trainer pod on the
    # checkpoint volume the operator mounted, not beside the ConfigMap's copy of the manifest.
    ordered: list[Task] = order_tasks(loaded.tasks, curriculum, base_dir=settings.spec_dir)
    return ordered


__all__ = ["load_tasks"]
