"""One call over one HTTP path, in a process of its own under an address-space limit; prints the
outcome as one JSON object (``{"ok": bool, "error": str | null, "max_rss_mib": float}``).

    python tests/bounded_reply_client.py PATH BASE_URL TIMEOUT_S HEADROOM_MIB

PATH is ``litellm``, ``fleet``, ``openai_compat`` or ``vllm``. The limit is set once the client is
built (imports done): the address space in use then, plus HEADROOM_MIB. A client that reads a reply
without bound meets the limit (a MemoryError, or the process dies) and never the machine's memory.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

PATHS = ("litellm", "fleet", "openai_compat", "vllm")
"""Every HTTP path the reply contract covers."""


def limit_address_space(headroom_mib: int) -> None:
    """Cap this process's address space at what it uses now plus ``headroom_mib``."""
    with open("/proc/self/status", encoding="ascii") as status:
        in_use_kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    limit = (in_use_kib + headroom_mib * 1024) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def judge_call(path: str, base_url: str, timeout_s: float, headroom_mib: int) -> dict[str, Any]:
    from rt4chart.judges.policy import PolicyBackend
    from rt4chart.method.tasks import VerifyInput, build_request, load_prompts
    from rt4chart.method.text import segment_context
    from rt4chart.protocol import GenerationParams

    backend: PolicyBackend
    call: dict[str, object] = {"name": "fault", "model": "openai/fault", "timeout_s": timeout_s, "max_attempts": 1}
    if path == "openai_compat":
        from rt4chart.judges.openai_compat import OpenAICompatBackend, OpenAICompatSettings

        backend = OpenAICompatBackend(OpenAICompatSettings.model_validate(call), api_key="sk-fault", api_base=base_url)
    elif path == "litellm":
        from rt4chart.judges.litellm import LiteLLMBackend, LiteLLMSettings

        backend = LiteLLMBackend(LiteLLMSettings.model_validate(call), api_key="sk-fault", api_base=base_url)
    else:
        from rt4chart.judges.fleet import FleetBackend, FleetMember, FleetRouting
        from rt4chart.judges.litellm import LiteLLMSettings

        member = FleetMember(model="openai/fault", api_base=base_url, api_key="sk-fault")
        backend = FleetBackend(LiteLLMSettings.model_validate(call), [member], FleetRouting())
    _, sentences = segment_context("The sky is blue.")
    payload = VerifyInput(stage="global", claims=["The sky is green."], sentences=sentences, chunk=0, question=None)
    request = build_request(payload, load_prompts(), GenerationParams(max_tokens=256))
    limit_address_space(headroom_mib)
    response = asyncio.run(backend.complete(request))
    return {"ok": response.parsed is not None, "error": response.error}


def vllm_call(base_url: str, timeout_s: float, headroom_mib: int) -> dict[str, Any]:
    from rt4chart.signals.base import ScoreRequest, SignalError
    from rt4chart.signals.vllm_client import VllmPromptLogprobsBackend

    # The tokenizer is never used: the request is given as token ids.
    client = VllmPromptLogprobsBackend(base_url, None, "fault", model="fault", timeout_s=timeout_s)  # type: ignore[arg-type]
    limit_address_space(headroom_mib)
    try:
        scores = client.score([ScoreRequest([1, 2, 3], 1)])
    except SignalError as error:
        return {"ok": False, "error": str(error)}
    return {"ok": scores == [[-1.0, -1.0]], "error": None}


def main() -> None:
    path, base_url, timeout_s, headroom_mib = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    if path == "vllm":
        outcome = vllm_call(base_url, timeout_s, headroom_mib)
    else:
        outcome = judge_call(path, base_url, timeout_s, headroom_mib)
    outcome["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
