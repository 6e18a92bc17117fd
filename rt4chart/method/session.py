"""One sample's conversation with its judge: render a step's request, send it, count usage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from rt4chart.languages import ENGLISH
from rt4chart.method.prompts import PromptTemplate, localize
from rt4chart.method.tasks import build_request
from rt4chart.protocol import Backend, GenerationParams, JudgeRequest, JudgeResponse, Message
from rt4chart.types import Usage


@dataclass
class JudgeSession:
    """Calls one backend on behalf of one sample and keeps that sample's usage."""

    backend: Backend
    prompts: dict[str, PromptTemplate]
    params: GenerationParams = field(default_factory=GenerationParams)
    usage: Usage = field(default_factory=Usage)
    usage_by_judge: dict[str, Usage] = field(default_factory=dict)
    language: str = ENGLISH
    """The answer's language: a prompt for another language than English says so (:func:`localize`)."""

    def request(self, payload: BaseModel, follow_up: list[Message] | None = None) -> JudgeRequest:
        """The request of ``payload``'s step (``follow_up`` appended after the rendered prompt)."""
        request = build_request(payload, self.prompts, self.params, follow_up)
        if self.language == ENGLISH:
            return request
        messages, version = localize(request.messages, request.prompt_version, self.language)
        return request.model_copy(update={"messages": messages, "prompt_version": version})

    async def send(self, request: JudgeRequest) -> JudgeResponse:
        """Call the judge and record what it cost."""
        response = await self.backend.complete(request)
        self.usage = self.usage + response.usage
        shares = response.usage_by_judge or {response.judge or self.backend.name: response.usage}
        for judge, usage in shares.items():
            self.usage_by_judge[judge] = self.usage_by_judge.get(judge, Usage()) + usage
        return response
