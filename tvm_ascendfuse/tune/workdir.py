"""The work dir of tuning runs: what a killed or budget-stopped run leaves for the next one to resume.

    WORK/profile.json                      per kernel (by workload id): untuned time of one launch, launches
    WORK/kernels/<id>/database_*.json      the search's measured candidates (MetaSchedule JSON database)
    WORK/kernels/<id>/state.json           candidates measured and lost so far

A kernel is done when the output database holds records for it (the side-by-side check writes them last);
a rerun skips it. A kernel whose search was cut off continues from the candidates its search database holds.
Each file is written whole (JSON state through a rename) or appended a line at a time (MetaSchedule's
databases); a line torn by a kill is dropped when the database is opened again.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

PROFILE_FILE = "profile.json"
STATE_FILE = "state.json"


def write_json(path: Path, data) -> None:
    """Write ``data`` so that a reader (or a kill) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path, default):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def drop_torn_lines(path: Path) -> int:
    """Remove lines that are not complete JSON (a write cut off by a kill) from a JSON-lines file; returns
    how many were dropped. Only the last line can be torn: the files are append-only."""
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    good = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            continue
        good.append(line)
    if len(good) != len(lines):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            f.write("".join(line + "\n" for line in good))
        os.replace(tmp, path)
    return len(lines) - len(good)


class WorkDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def kernel_dir(self, kernel) -> Path:
        return self.path / "kernels" / kernel.key

    def search_database(self, kernel):
        """The kernel's search records so far (a MetaSchedule JSON database, created when missing)."""
        from ..schedule.tuned import RECORDS_FILE, WORKLOADS_FILE, open_database

        folder = self.kernel_dir(kernel)
        folder.mkdir(parents=True, exist_ok=True)
        for name in (WORKLOADS_FILE, RECORDS_FILE):
            drop_torn_lines(folder / name)
        return open_database(folder, allow_missing=True)

    def state(self, kernel) -> dict:
        data = read_json(self.kernel_dir(kernel) / STATE_FILE, {})
        return {"measured": int(data.get("measured", 0)), "failed": int(data.get("failed", 0))}

    def save_state(self, kernel, state: dict) -> None:
        write_json(self.kernel_dir(kernel) / STATE_FILE, {"name": kernel.name, "rule": kernel.rule, **state})

    def profile(self) -> dict:
        return read_json(self.path / PROFILE_FILE, {})

    def save_profile(self, entries: dict) -> None:
        write_json(self.path / PROFILE_FILE, {**self.profile(), **entries})
