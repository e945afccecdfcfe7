"""Build a tree shaped like an engine's git checkout from one of its releases, for CI to run
docs/ci.md's job on (so the recipe cannot rot): the release's Python package as its wheel has
it, less what a build leaves (compiled extensions, ``_version.py``), and the source
distribution's ``tests/``, ``requirements/`` and ``pyproject.toml``, committed to a fresh git
repository, tagged ``v<release>``, with one commit after the tag (as a pull request's branch).

    python .ci/checkout_tree.py vllm 0.33.0 DEST    # prints DEST
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from testbed import integrations
from testbed.contract.source import release_tests, unpacked


def main(engine: str, release: str, dest: str) -> None:
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=False)
    installed = integrations.get(engine).engine.release()[0]
    if release == installed:  # the installed wheel's files: no download
        package = Path(importlib.util.find_spec(engine).origin).parent
    else:
        package = unpacked(engine, release) / engine
    shutil.copytree(package, root / engine, ignore=shutil.ignore_patterns("*.so", "*.so.*", "__pycache__",
                                                                          "_version.py"))
    tests = release_tests(engine, release)
    for item in ("tests", "requirements", "pyproject.toml"):
        if (tests / item).is_dir():
            shutil.copytree(tests / item, root / item, ignore=shutil.ignore_patterns("__pycache__"))
        elif (tests / item).is_file():
            shutil.copy(tests / item, root / item)

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(root), "-c", "user.email=ci@a2a-testbed", "-c", "user.name=ci", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", f"{engine} {release}")
    git("tag", f"v{release}")
    (root / "PULL_REQUEST.md").write_text("a change after the release, as a pull request's branch has\n")
    git("add", "-A")
    git("commit", "-qm", "a pull request's change")
    print(root)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    main(*sys.argv[1:])
