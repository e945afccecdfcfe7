"""The README's and the docs' commands still work as written: every ``a2a-testbed`` command in
them (a code block's line or an inline one, synopses with ``[...]`` or ``|`` aside) parses with
the real command line, and its scenario flags describe a scenario the model accepts; the
README's cheap commands run, and exit as the page says (a run against a mutant fails)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from testbed import cli
from testbed.scenario.model import from_args, scenario_given

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(page: Path) -> list[str]:
    """The ``a2a-testbed`` commands of ``page``: code-block lines and inline spans, comments
    and line continuations dropped, synopses (``[...]``, ``|``, ``...``) left out."""
    text = page.read_text()
    found = []
    for block in re.findall(r"```(?:sh|bash)?\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            found.append(line.split(" #")[0].strip())
    found += re.findall(r"`((?:\.venv/bin/)?a2a-testbed [^`]+)`", text)
    out = []
    for cmd in found:
        cmd = cmd.removeprefix(".venv/bin/")
        if cmd.startswith("a2a-testbed ") and not re.search(r"\[|\||\.\.\.|<|\$\(", cmd):
            out.append(cmd)
    return out


COMMANDS = sorted({(page.relative_to(ROOT).as_posix(), cmd) for page in PAGES for cmd in _commands(page)})


def test_docs_have_commands_to_check():
    assert len(COMMANDS) >= 20 and any(page == "README.md" for page, _ in COMMANDS)


@pytest.mark.parametrize("page, command", COMMANDS)
def test_docs_command_parses_as_written(page, command):
    argv = shlex.split(command)[1:]
    try:
        args = cli._parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{page}: `{command}` does not parse (exit {e.code})")
    # A command for another engine release is held to that release's rules (its sequence-parallel
    # rule, the formats its builder takes), which only that release, fetched, can answer: parsed here.
    other_release = any(getattr(args, f"{name}_source", None) for name in ("vllm", "sglang"))
    if args.command == "run" and scenario_given(args) and args.job == "integration" and not other_release:
        from_args(args, (args.layout or [None])[0])  # raises ScenarioInputError naming the flag


def _readme_block(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [line.split(" #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("command", _readme_block("Three things to try next"))
def test_docs_readme_next_steps_run(command, capsys):
    argv = shlex.split(command.removeprefix(".venv/bin/"))
    assert argv[0] == "a2a-testbed"  # pyproject's console script, testbed.cli:main, run here
    code = cli.main(argv[1:])
    out, err = capsys.readouterr()
    if "--mutant" in argv:  # the page shows the mutant being caught
        assert code == 1 and "FAIL" in out and "reproduce: " in out, out[-2000:]
    else:
        assert code == 0, out[-2000:] + err[-2000:]
