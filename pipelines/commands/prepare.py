"""``dynlm prepare``: the Ray Data preprocessing job (read, anonymize, fit, encode to Parquet)."""

from __future__ import annotations

import argparse

QUARANTINE_EXIT_CODE = 2


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "prepare", help="Ray Data: read, anonymize, fit vocabulary + BPE, encode to Parquet shards",
        description="Prepare <output-root>/<data-hash>/ (Parquet shards per split, quarantine, "
                    "preprocessor.json, manifest.json). A complete folder with the same data "
                    "settings is reused without recomputing.",
    )
    parser.add_argument("--config", help="YAML with the data settings (a data config mapping, or a job "
                                         "config whose `task:` and `data:` sections are used)")
    parser.add_argument("--task", help="the task whose stages run (default: the job config's task, else lm; "
                                       "package.module:Class for a task outside dynlm)")
    parser.add_argument("--input", action="append", default=[], metavar="PATH",
                        help="input file, folder or URI (s3://, gs://); repeatable; replaces the config's inputs. "
                             "Files/folders named train, valid/dev/development, test (wiki.train.tokens, "
                             "development/) keep that split; unsplit inputs are split by document hash")
    parser.add_argument("--output-root", help="where prepared folders go (default: the config's output_root)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a data setting, e.g. --set data.vocab_size=5000 (the data. prefix is optional; repeatable)")
    parser.add_argument("--strict", action="store_true",
                        help=f"exit with code {QUARANTINE_EXIT_CODE} if any input record is quarantined")
    parser.add_argument("--no-progress", action="store_true", help="hide Ray Data progress bars")
    parser.set_defaults(func=run_prepare)


def _has_default_inputs(config_cls) -> bool:
    """Whether the task's data config has default inputs (the naming task: the stdlib)."""
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(config_cls)}["inputs"]
    return field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


def load_data_config(config_path: str | None, inputs: list[str], output_root: str | None, overrides: list[str],
                     task_name: str | None = None):
    """``(task, data config)`` from YAML (plain or a job config's ``task:``/``data:`` sections),
    ``--task``, flags, then --set overrides."""
    import yaml

    from dynlm.config import ConfigError
    from dynlm.tasks import DEFAULT_TASK, get_task

    data: dict = {}
    if config_path:
        with open(config_path, encoding="utf-8") as fh:
            loaded = yaml.safe_load(fh) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config_path}: top level must be a mapping")
        if isinstance(loaded.get("data"), dict):
            task_name = task_name or loaded.get("task")
            data = dict(loaded["data"])
        else:
            data = loaded
    try:
        task = get_task(task_name or DEFAULT_TASK)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"--task: {exc}") from exc
    if inputs:
        data["inputs"] = list(inputs)
    if output_root:
        data["output_root"] = output_root
    if "inputs" not in data and not _has_default_inputs(task.data_config):
        raise ConfigError("no inputs: pass --input PATH (repeatable) or set `inputs:` in --config")
    return task, task.data_config.from_dict(data).with_overrides([_data_key(item) for item in overrides])


def _data_key(override: str) -> str:
    """``data.vocab_size=5000`` (the key as `train`, `tune` and `run` spell it) or ``vocab_size=5000``
    -> ``vocab_size=5000``; another section's key is a one-line error."""
    from dynlm.config import ConfigError

    key, _, value = override.partition("=")
    section, dot, name = key.partition(".")
    if not dot:
        return override
    if section != "data":
        raise ConfigError(f"--set {override}: dynlm prepare takes data settings only (data.{name}=... or "
                          f"{name}=...); {section}.* belongs to dynlm train / tune / run")
    return f"{name}={value}"


def run_prepare(args: argparse.Namespace) -> int:
    """Config errors, inputs that follow no split rule and ``--strict`` quarantines are user
    errors: ``pipelines.cli.main`` prints them as one line and exits 2."""
    from pipelines.prepare import prepare

    task, cfg = load_data_config(args.config, args.input, args.output_root, args.overrides, args.task)
    prepared = prepare(cfg, task=task, strict=args.strict, progress=not args.no_progress)
    print(f"prepared data: {prepared.root}")
    return 0
