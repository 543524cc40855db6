"""The tune's cache of finished trials, in its output folder: an interrupted tune continues where it stopped.

One JSON file, rewritten atomically after every measurement or check (a kill leaves the previous complete
file). Entries are keyed by the full settings they measured (canonical JSON), so a resumed tune that makes the
same decisions finds every trial it already ran. The file also holds a fingerprint of what the trials depend
on (the starting config, the trial lengths, the device, the number of ranks): a cache made for anything else is
set aside (renamed ``*.stale.json``) rather than trusted.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.strict_json import to_json

log = logging.getLogger("dlscale.tune")

CACHE_VERSION = 1


def settings_key(kind: str, settings: dict[str, Any], repeat: int = 0) -> str:
    """The entry's key: its kind ("measure" or "check"), the settings as canonical JSON, the repeat number."""
    return to_json([kind, repeat, sorted(settings.items())], indent=None, default=str).strip()


class TuneCache:
    """Finished trials by key; ``path`` None keeps them in memory only (non-zero ranks, tests)."""

    def __init__(self, path: Path | None, fingerprint: dict[str, Any]):
        self.path = path
        self.fingerprint = json.loads(to_json(fingerprint))  # as it reads back from the file
        self.entries: dict[str, Any] = {}
        self.resumed = 0  # entries found in the file at start
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"{path}: the tune's cache cannot be read ({error}); delete it to start the tune afresh"
            ) from None
        if (
            not isinstance(document, dict)
            or document.get("version") != CACHE_VERSION
            or document.get("fingerprint") != self.fingerprint
        ):
            stale = path.with_suffix(".stale.json")
            path.replace(stale)
            log.warning(
                "TUNE::%s was made for another config, device or trial length; set aside as %s, starting afresh",
                path,
                stale,
            )
            return
        self.entries = dict(document.get("entries", {}))
        self.resumed = len(self.entries)

    def get(self, key: str) -> Any:
        return self.entries.get(key)

    def put(self, key: str, value: Any) -> None:
        self.entries[key] = value
        if self.path is not None:
            document = {"version": CACHE_VERSION, "fingerprint": self.fingerprint, "entries": self.entries}
            write_text_atomically(self.path, to_json(document))
