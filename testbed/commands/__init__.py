"""The ``a2a-testbed`` commands, a module each: ``add_parser(sub)`` (its sub-command and flags)
and ``main(args)`` (its exit status; a :class:`~testbed.commands.common.UsageError` is exit 2
with one line). A new command is a new module here, named in :data:`COMMANDS` (the order of
``a2a-testbed --help``); what several share is in :mod:`testbed.commands.common`."""

COMMANDS = ("version", "run", "fuzz", "mutants", "engine", "engine-tests", "serve", "contract", "findings", "history",
            "sweep")
