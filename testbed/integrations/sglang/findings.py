"""What the testbed found in SGLang 0.5.23's code, each written up in ``docs/findings.md``
under its id; they apply to scenarios of ``--integration sglang``."""

from __future__ import annotations

from fakes.flashinfer.profiles import resolve
from testbed.integrations.base import Finding

FINDINGS: tuple[Finding, ...] = (
    Finding("SGL-002", "SGLang 0.5.23's dispatcher imports flashinfer.comm.MoeAlltoAll, which FlashInfer 0.7.4 "
                       "removed: its guarded import sets use_flashinfer False and every FlashinferDispatcher "
                       "raises ImportError",
            lambda sc: sc.profile == "0.7.4",
            (("completes", "Flashinfer is not installed or does not support A2A"),)),
    Finding("SGL-003", "SGLang's FlashinferDispatcher builds MoeAlltoAll on a FlashInfer before 0.7.1 without the "
                       "barrier on the EP group that those releases leave to the caller",
            lambda sc: not resolve(sc.profile).init_barrier,
            (("collectives", "was not followed by a barrier"),),
            reachable="no",
            evidence="SGLang's ModelRunner.load_model ends with dist_barrier_after_load, a monitored_barrier on "
                     "the TP group's CPU group, after the whole model (every dispatcher's MoeAlltoAll) is built and "
                     "before any forward; the FlashInfer A2A backend runs only where DP attention spans the TP "
                     "group, whose ranks are the EP group's; and run: with the last EP rank's zeroing held until "
                     "rank 0 moves on (--late-zeroing), the scheduler's token-count all-gather on that group before "
                     "every forward orders the two, and the round completes",
            code=(("sglang/srt/layers/moe/token_dispatcher/flashinfer.py", r"MoeAlltoAll\("),)),
)
