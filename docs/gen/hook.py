"""MkDocs hook: add the generated pages (``pages.py``) to the site at build time."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pages  # noqa: E402


def on_config(config):
    """The nav's "Commands" entry becomes the index and one page per command."""
    entries = ["commands/index.md"] + [{name: f"commands/{name}.md"} for name in pages.commands()]

    def fill(items):
        for item in items or []:
            if isinstance(item, dict):
                for key, value in item.items():
                    if key == "Commands":
                        item[key] = entries
                    elif isinstance(value, list):
                        fill(value)

    fill(config["nav"])
    return config


def on_files(files: Files, config) -> Files:
    for path, text in pages.pages().items():
        old = files.get_file_from_path(path)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, path, content=text))
    return files
