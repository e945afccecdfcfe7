"""vLLM's offline data parallel as its documentation shows it
(``examples/offline_inference/data_parallel.py``): the user's script of a served run's offline
entries, ``python -m testbed.integrations.vllm.offline RUN_DIR MODEL_DIR DP ENGINE_ARGS_JSON``.

One process per DP rank, started as the example starts them (``multiprocessing.Process``),
each told its place by ``VLLM_DP_RANK``, ``VLLM_DP_RANK_LOCAL``, ``VLLM_DP_SIZE``,
``VLLM_DP_MASTER_IP`` and ``VLLM_DP_MASTER_PORT``, each an ``LLM`` of the engine arguments
with expert parallel, generating its contiguous share of the run's requests (the plan's
``offline_requests``); a rank with none generates a placeholder request, as the example's
does (every DP rank's engine must step). Each writes its answers to ``answers<DP rank>.json``
(:func:`testbed.integrations.served.write_answers`). What vLLM starts below them gets the
fake, the run's arena and the serving plugin as ``vllm serve``'s processes do.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sys
import time

# A DP rank without requests generates this one (the example's "Placeholder" prompt): its
# answer is no request's.
PLACEHOLDER = {"prompt": [3, 4], "max_tokens": 1}


def share(requests: int, dp: int, rank: int) -> range:
    """The requests DP rank ``rank`` generates, as the example splits its prompts: contiguous,
    the first ``requests % dp`` ranks one more."""
    floor, remainder = divmod(requests, dp)
    start = rank * floor + min(rank, remainder)
    return range(start, start + floor + (rank < remainder))


def _rank(run_dir: str, model_dir: str, dp: int, rank: int, port: int, engine_args: dict, requests: list) -> None:
    os.environ.update(VLLM_DP_RANK=str(rank), VLLM_DP_RANK_LOCAL=str(rank), VLLM_DP_SIZE=str(dp),
                      VLLM_DP_MASTER_IP="127.0.0.1", VLLM_DP_MASTER_PORT=str(port))
    from vllm import LLM, SamplingParams

    from testbed.integrations.served import write_answers

    mine = {i: requests[i] for i in share(len(requests), dp, rank)}
    asked = list(mine.values()) or [PLACEHOLDER]
    llm = LLM(model=model_dir, **engine_args)
    params = [SamplingParams(max_tokens=rq["max_tokens"], ignore_eos=True, temperature=0.0, logprobs=2,
                             prompt_logprobs=0) for rq in asked]
    outs = llm.generate([{"prompt_token_ids": rq["prompt"]} for rq in asked], params, use_tqdm=False)
    answers = {}
    for i, out in zip(mine, outs):
        prompt, done = mine[i]["prompt"], out.outputs[0]
        answers[i] = {"ids": list(done.token_ids),
                      "top2": [sorted((lp.logprob for lp in entry.values()), reverse=True)[:2] for entry in done.logprobs],
                      "prompt_logprobs": [entry[token].logprob for token, entry in zip(prompt[1:], out.prompt_logprobs[1:])]}
    write_answers(run_dir, rank, answers)
    # The engine's own shutdown, where the example sleeps a second and its launcher kills a
    # process that has not ended in 5 minutes: a process of multiprocessing's ends by joining
    # its children, vLLM's engine core among them, which nothing else tells to stop (its
    # shutdown runs at exit or when the LLM is collected, neither of which happens first).
    # generate returned once this rank's engine core saw every DP rank's wave end: all idle.
    llm.llm_engine.engine_core.shutdown()


def main(argv: list[str]) -> int:
    run_dir, model_dir, dp, engine_args = argv[0], argv[1], int(argv[2]), json.loads(argv[3])
    with open(os.path.join(run_dir, "plan.json")) as f:
        plan = json.load(f)
    requests, deadline = plan["offline_requests"], time.monotonic() + plan["offline_timeout_s"]
    with socket.socket() as s:  # the DP group's master port, as the example's get_open_port()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [multiprocessing.Process(target=_rank, args=(run_dir, model_dir, dp, rank, port, engine_args, requests))
             for rank in range(dp)]
    for p in procs:
        p.start()
    for p in procs:  # the testbed's watchdog over the whole tree ends a hang below it too
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(p.exitcode is None for p in procs):
        return 124
    return max(abs(p.exitcode) for p in procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
