"""One sample's conversation with its judge: render a prompt, call the backend, count usage."""

from __future__ import annotations

from dataclasses import dataclass, field

from rt4chart.backends.base import (
    Backend,
    GenerationParams,
    JudgePayload,
    JudgeRequest,
    JudgeResponse,
    Message,
    Task,
)
from rt4chart.prompts import PromptTemplate
from rt4chart.types import Usage


@dataclass
class JudgeSession:
    """Calls one backend on behalf of one sample and keeps that sample's usage."""

    backend: Backend
    prompts: dict[str, PromptTemplate]
    params: GenerationParams = field(default_factory=GenerationParams)
    usage: Usage = field(default_factory=Usage)
    usage_by_judge: dict[str, Usage] = field(default_factory=dict)

    def request(
        self,
        task: Task,
        template: str,
        payload: JudgePayload,
        fields: dict[str, str],
        follow_up: list[Message] | None = None,
    ) -> JudgeRequest:
        """Render ``template`` with ``fields`` into a request (``follow_up`` appended after it)."""
        prompt = self.prompts[template]
        return JudgeRequest(
            task=task,
            payload=payload,
            messages=prompt.render(**fields) + (follow_up or []),
            params=self.params,
            prompt_version=prompt.version,
        )

    async def send(self, request: JudgeRequest) -> JudgeResponse:
        """Call the judge and record what it cost."""
        response = await self.backend.complete(request)
        self.usage = self.usage + response.usage
        shares = response.usage_by_judge or {response.judge or self.backend.name: response.usage}
        for judge, usage in shares.items():
            self.usage_by_judge[judge] = self.usage_by_judge.get(judge, Usage()) + usage
        return response
