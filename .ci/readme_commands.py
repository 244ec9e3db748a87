"""Prints the set-up commands of README.md (the ```bash blocks of its "## Set-up" section), one
per line; CI runs exactly these. Standard library only: it runs before any install."""

from __future__ import annotations

import pathlib
import re
import sys


def readme_commands(path: str | pathlib.Path = "README.md") -> list[str]:
    readme = pathlib.Path(path).read_text(encoding="utf-8")
    if "## Set-up" not in readme:
        return []
    section = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


if __name__ == "__main__":
    for command in readme_commands(sys.argv[1] if len(sys.argv) > 1 else "README.md"):
        print(command)
