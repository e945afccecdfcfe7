"""The ``a2a-testbed`` commands that live in a module of their own: each module has
``add_parser(sub)`` (its sub-command's flags) and ``main(args)`` (exit status). A new command is
a new module here, named in :data:`COMMANDS`; the rest are still in :mod:`testbed.cli`."""

COMMANDS = ("engine-tests", "serve")
