"""What the rank pool's fork server imports when ``A2A_PRELOAD_ENGINES`` names vllm: the vLLM modules
``--integration vllm`` drives, imported once so every rank forks with them loaded (their pages
shared). Nothing happens where vLLM is not installed."""

from testbed.integrations import vllm

vllm.preload()
