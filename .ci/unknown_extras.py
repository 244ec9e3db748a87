"""Fails (exit 1) when a command's output holds pip's warning that a package does not provide an
extra, e.g. `pip install -e '.[torch,jax,reprot]'`: pip only warns, installs the rest, and the
misspelt extra's packages (here matplotlib) are silently missing. Other pip warnings pass.
Standard library only: CI runs it on each README command's output (.ci/run)."""

from __future__ import annotations

import re
import sys

# pip's resolver: logger.warning("%s %s does not provide the extra '%s'", name, version, extra)
UNKNOWN_EXTRA = re.compile(r"WARNING: (\S+) (\S+) does not provide the extra '([^']*)'")


def unknown_extras(output: str) -> list[str]:
    """The lines of `output` in which pip says that a package does not provide an extra."""
    return [line.strip() for line in output.splitlines() if UNKNOWN_EXTRA.search(line)]


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8", errors="replace") as log:
        found = unknown_extras(log.read())
    for line in found:
        print(f"CI: pip ignored an extra that does not exist (misspelt?): {line}", file=sys.stderr)
    sys.exit(1 if found else 0)
