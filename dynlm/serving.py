"""A trained model's files: written with the logged model, read back to serve or score it.

``pipelines/tracking.py`` writes the artifacts with the logged model and reads them back;
``pipelines/pyfunc_model.py`` (the MLflow pyfunc, logged as *models from code*) loads them and
hands requests to the model's task (``Task.serve``). The artifacts are plain files::

    weights.pt          the state_dict (torch.save of tensors; loaded with weights_only=True)
    model.json          {"format": "dynlm-pyfunc", "version": 2, "task": "lm", "model_config": {...}, "vocab_spec": {...}}
    preprocessor.json   the task's preprocessor of the prepared data (the LM: vocabulary, short list, BPE)

The model is rebuilt through its task (:func:`dynlm.tasks.get_task`), so a model of any task is
logged, registered and loaded the same way. What a request may hold is the task's: the LM's in
:mod:`dynlm.tasks.lm_serving`, the error of a bad one in :mod:`dynlm.requests`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dynlm.tasks import DEFAULT_TASK, get_task

FORMAT_NAME = "dynlm-pyfunc"
FORMAT_VERSION = 2  # 2: model.json names the task
WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "model.json"
PREPROCESSOR_FILE = "preprocessor.json"
ARTIFACT_KEYS = {"weights": WEIGHTS_FILE, "model_config": CONFIG_FILE, "preprocessor": PREPROCESSOR_FILE}


# ---------------------------------------------------------------------------------------------
# Files <-> model
# ---------------------------------------------------------------------------------------------


def write_artifacts(folder: str | Path, model: torch.nn.Module, model_cfg, spec, preprocessor_path: str | Path,
                    *, task: str = DEFAULT_TASK) -> dict[str, str]:
    """Write the three artifact files of a model of ``task`` into ``folder``; return ``{artifact key: path}``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state_dict = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    torch.save(state_dict, folder / WEIGHTS_FILE)
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "task": task,
            "model_config": model_cfg.to_dict(), "vocab_spec": spec.to_dict()}
    (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    (folder / PREPROCESSOR_FILE).write_bytes(Path(preprocessor_path).read_bytes())
    return {key: str(folder / name) for key, name in ARTIFACT_KEYS.items()}


def load_artifacts(weights_path: str | Path, config_path: str | Path, preprocessor_path: str | Path):
    """Rebuild the model from its artifact files, through its task.

    Returns:
        ``(task, model, model_cfg, spec, preprocessor)``; the model is in eval mode on the CPU.
    """
    meta = json.loads(Path(config_path).read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{config_path}: not a {FORMAT_NAME} v{FORMAT_VERSION} config "
                         f"(format={meta.get('format')!r}, version={meta.get('version')!r})")
    task = get_task(meta["task"])
    model_cfg = task.model_config.from_dict(meta["model_config"])
    spec = task.spec_class.from_dict(meta["vocab_spec"])
    preprocessor = task.load_preprocessor(Path(preprocessor_path).read_text(encoding="utf-8"))
    if preprocessor.spec.to_dict() != spec.to_dict():
        raise ValueError(f"{preprocessor_path} does not match the model's vocabulary: "
                         f"{preprocessor.spec.to_dict()} != {spec.to_dict()}")
    model = task.build_model(model_cfg, spec)
    state_dict = torch.load(weights_path, map_location="cpu", weights_only=True)
    model.load_state_dict(state_dict)
    model.eval()
    return task, model, model_cfg, spec, preprocessor


def load_model_dir(model_dir: str | Path):
    """Load from a downloaded MLflow model folder (its ``artifacts/`` subfolder)."""
    folder = Path(model_dir) / "artifacts"
    missing = [name for name in ARTIFACT_KEYS.values() if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{model_dir} is not a dynlm pyfunc model: missing artifacts/{missing}")
    return load_artifacts(folder / WEIGHTS_FILE, folder / CONFIG_FILE, folder / PREPROCESSOR_FILE)


