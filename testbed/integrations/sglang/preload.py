"""What a rank pool's fork server imports for --integration sglang (``A2A_PRELOAD_MODULES``): the
modules the adapter drives, imported once so every rank forks with them loaded (their pages
shared). Nothing happens where the engine is not installed."""

from testbed.integrations.sglang.environment import ENGINE

ENGINE.preload()
