"""``python -m testbed.sweep_group COMMANDS``: the process of one group of sweeps
(:mod:`testbed.harness.sweeps`). ``COMMANDS`` is a JSON list of ``a2a-testbed`` argument lists,
run one after another in this process, so what they import (an engine release) and the rank
pools' fork server are paid for once; each one's end is a line of stdout with its exit code
and seconds, which the sweep reads to judge each apart."""

import json
import sys
import time
import traceback

from testbed.cli import main
from testbed.harness.sweeps import END


def run(argvs: list[list[str]]) -> None:
    for argv in argvs:
        started = time.monotonic()
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Exception:  # noqa: BLE001 - a command that crashes fails; the group goes on
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        print(f"{END}{code} {time.monotonic() - started:.3f}", flush=True)


if __name__ == "__main__":  # the rank pools' fork server imports this module as its main
    run(json.loads(sys.argv[1]))
