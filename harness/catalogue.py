"""A catalogue entry by name: one YAML file per entry in a folder of `conf/` (GPUs, serving engines), a user's own
YAML file, or the figures given inline; read as a mapping, with the words an error should name it by."""

from pathlib import Path

import yaml


def catalogue_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def catalogue_entry(choice, folder: Path, kind: str, key: str, others: str = "") -> tuple[dict, str]:
    """`choice` (a name of `folder`, a YAML file's path, or a mapping) as (its figures, how an error names it).
    Raises ValueError for a missing file, an unknown name (listing the catalogue and `others`) or bad YAML."""
    if not isinstance(choice, str):
        return choice, key
    path = Path(choice).expanduser()
    if path.suffix in (".yaml", ".yml") or "/" in choice:
        if not path.is_file():
            raise ValueError(f"{kind} file {choice!r} does not exist")
        where = f"{kind} file {str(path)!r}"
    elif (folder / f"{choice}.yaml").is_file():
        path, where = folder / f"{choice}.yaml", f"{kind} {choice!r}"
    else:
        raise ValueError(f"unknown {kind} {choice!r}; the catalogue has {', '.join(catalogue_names(folder))}{others} "
                         "(or give a YAML file's path, or the figures inline)")
    try:
        return yaml.safe_load(path.read_text()), where
    except yaml.YAMLError as e:
        raise ValueError(f"{where} is not valid YAML: {e}") from None
