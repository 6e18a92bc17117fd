"""One sample's conversation with its judge: render a prompt, call the backend, count usage."""

from __future__ import annotations

from dataclasses import dataclass, field

from rt4chart.backends.base import (
    Backend,
    DecomposeInput,
    GenerationParams,
    JudgeRequest,
    JudgeResponse,
    Message,
    Task,
    VerifyInput,
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

    async def ask(
        self,
        task: Task,
        template: str,
        payload: DecomposeInput | VerifyInput,
        fields: dict[str, str],
        follow_up: list[Message] | None = None,
    ) -> JudgeResponse:
        """Render ``template`` with ``fields``, call the judge, and record what it cost.

        ``follow_up`` messages are appended after the rendered prompt (used to re-ask a judge
        whose evidence was not found in the context).
        """
        prompt = self.prompts[template]
        request = JudgeRequest(
            task=task,
            payload=payload,
            messages=prompt.render(**fields) + (follow_up or []),
            params=self.params,
            prompt_version=prompt.version,
        )
        response = await self.backend.complete(request)
        self.usage = self.usage + response.usage
        judge = response.judge or self.backend.name
        self.usage_by_judge[judge] = self.usage_by_judge.get(judge, Usage()) + response.usage
        return response
