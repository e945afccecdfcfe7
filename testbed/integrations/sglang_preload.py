"""What the rank pool's fork server imports when ``A2A_PRELOAD_ENGINES`` names sglang: the
SGLang modules ``--integration sglang`` drives, imported once so every rank forks with them
loaded. Nothing happens where SGLang is not installed."""

from testbed.integrations import sglang

sglang.preload()
