"""What the testbed found in SGLang 0.5.23's code, each written up in ``docs/findings.md``
under its id; they apply to scenarios of ``--integration sglang``."""

from __future__ import annotations

from testbed.integrations.base import Finding

FINDINGS: tuple[Finding, ...] = (
    Finding("SGL-002", "SGLang 0.5.23's dispatcher imports flashinfer.comm.MoeAlltoAll, which FlashInfer 0.7.4 "
                       "removed: its guarded import sets use_flashinfer False and every FlashinferDispatcher "
                       "raises ImportError",
            lambda sc: sc.profile == "0.7.4",
            (("completes", "Flashinfer is not installed or does not support A2A"),)),
)
