"""A judge fleet: several deployments of one model behind litellm's ``Router``.

vLLM replicas on several hosts, or one model at two providers, answer as one judge. The router
picks a deployment for every attempt (``routing_strategy``; ``usage-based-routing`` reads each
deployment's ``rpm``/``tpm``), cools a failing one down (``allowed_fails`` failures within a
minute, or a 429, whose Retry-After sets how long) and sends the next attempt elsewhere.

A deployment that refuses (a rejected key, an unknown model, a refused connection) is one
replica's problem, not the judge's: the request is retried on another deployment, and the
circuit breaker (:class:`~rt4chart.judges.circuit.FleetCircuit`) opens only when every
deployment refuses. The sender (:class:`FleetSender`) is litellm's with the router in place of
``acompletion``; everything else is the transport policy's (:mod:`rt4chart.judges.policy`):
reply parsing, re-asks, retries with backoff (each attempt re-routed, a Retry-After left to the
router's cool-down), usage, prices, key scrubbing.

The judge's identity (its name: the profile's, so every cache key and record) is the logical
model, never a replica: a cached verdict is reused whichever replica produced it. The deployment
that answered is reported per call in :attr:`~rt4chart.protocol.JudgeResponse.deployment`
(and logged at debug level on ``rt4chart.fleet``). Each deployment's key is given to the router in
that deployment's own parameters, so it is only ever sent to that deployment's base URL.

Fallbacks to *other* models (the router's ``fallbacks``) are deliberately not offered: another
model's verdicts would be stored under this judge's name.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Literal

# Importing litellm's router imports litellm, which fetches its model price list from the network
# unless told to use the copy it ships (as rt4chart.judges.litellm does; a user's setting wins).
# It must be set before that import, and ours comes first here: a fleet reaches no host at import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from litellm.router import Router
from litellm.types.router import RouterRateLimitError

from rt4chart.judges.circuit import FleetCircuit
from rt4chart.judges.litellm import LiteLLMSender, LiteLLMSettings, litellm_provider
from rt4chart.judges.policy import PolicyBackend, non_transient_reason
from rt4chart.scrubbing import scrub

log = logging.getLogger("rt4chart.fleet")

RoutingStrategy = Literal["simple-shuffle", "least-busy", "usage-based-routing", "latency-based-routing"]
"""How the router picks a deployment (litellm's names): weighted random (by rpm/tpm when given),
fewest calls in flight, lowest use of its rpm/tpm limits, or lowest recent latency."""


@dataclass(frozen=True)
class FleetMember:
    """One deployment, resolved: the model string, where it is served and the key that goes there."""

    model: str
    """litellm model string of this deployment (the same model; the provider prefix may differ)."""
    api_base: str | None
    """Its base URL; ``None``: the provider's default endpoint."""
    api_key: str | None
    """The key sent to ``api_base`` and nowhere else."""
    rpm: int | None = None
    """Requests per minute it accepts (routing and pre-call checks)."""
    tpm: int | None = None
    """Tokens per minute it accepts."""

    @property
    def label(self) -> str:
        """How records and logs name it: model and base URL, never the key."""
        return f"{self.model}@{self.api_base}" if self.api_base else self.model


@dataclass(frozen=True)
class FleetRouting:
    """The router's policy."""

    strategy: RoutingStrategy = "simple-shuffle"
    """How a deployment is picked for each attempt."""
    allowed_fails: int = 1
    """Failures a deployment may have within a minute before it is cooled down."""
    cooldown_s: float = 30.0
    """Seconds a failing deployment gets no calls (a 429's Retry-After, when given, decides)."""


class FleetSender(LiteLLMSender):
    """One attempt through litellm's ``Router`` over the fleet's deployments."""

    routes_around_failures = True

    def __init__(self, settings: LiteLLMSettings, members: list[FleetMember], routing: FleetRouting) -> None:
        if not members:
            raise ValueError("a judge fleet needs at least one deployment")
        self.members = members
        """The deployments, in the profile's order (their router ids are their positions)."""
        super().__init__(settings)
        # Retries are the policy's (counted and paced); the router only picks, cools and re-routes.
        self.router = Router(
            model_list=[
                {
                    "model_name": settings.model,
                    "litellm_params": {
                        "model": member.model,
                        **({"api_base": member.api_base} if member.api_base else {}),
                        **({"api_key": member.api_key} if member.api_key else {}),
                        **({"rpm": member.rpm} if member.rpm else {}),
                        **({"tpm": member.tpm} if member.tpm else {}),
                    },
                    "model_info": {"id": str(position)},
                }
                for position, member in enumerate(members)
            ],
            routing_strategy=routing.strategy,
            allowed_fails=routing.allowed_fails,
            cooldown_time=routing.cooldown_s,
            num_retries=0,
        )
        self._circuit = FleetCircuit(
            f"{self.name} (a fleet of {len(members)} deployments)",
            deployments=tuple(member.label for member in members),
        )

    @property
    def name(self) -> str:
        # The logical model (profile and model), whichever replica answers: no server in the name.
        settings = self.settings
        return settings.name if settings.name == settings.model else f"{settings.name}/{settings.model}"

    @property
    def secrets(self) -> frozenset[str]:
        return frozenset(member.api_key for member in self.members if member.api_key)

    def __repr__(self) -> str:
        return f"FleetSender(model={self.model!r}, deployments={[m.label for m in self.members]!r})"

    def circuit(self) -> FleetCircuit:
        return self._circuit

    def _structured_output(self) -> str:
        own_servers = all(m.api_base and litellm_provider(m.model) == "openai" for m in self.members)
        if self.settings.response_format == "auto" and own_servers:
            # OpenAI-compatible servers of the user's own enforce JSON schemas (see the base class).
            return "json_schema"
        return super()._structured_output()

    def _member(self, router_id: object) -> FleetMember | None:
        """The deployment the router knows by ``router_id`` (its position in the profile)."""
        position = "" if router_id is None else str(router_id)
        return self.members[int(position)] if position.isdigit() and int(position) < len(self.members) else None

    async def call(self, messages: list[dict[str, Any]], arguments: dict[str, Any]) -> Any:
        try:
            response = await self.router.acompletion(messages=messages, **arguments)
        except Exception as error:
            # The router stamps the deployment that failed on the error.
            member = self._member(getattr(error, "failed_deployment_id", None))
            reason = non_transient_reason(error)
            if member is not None and reason is not None:
                self._circuit.attempt_refused(member.label, scrub(reason, self.secrets))
            elif member is not None:
                self._circuit.attempt_answered(member.label)
            raise
        answered = self._member((getattr(response, "_hidden_params", None) or {}).get("model_id"))
        if answered is not None:
            self._circuit.attempt_answered(answered.label)
        return response

    def deployment(self, response: Any) -> str | None:
        member = self._member((getattr(response, "_hidden_params", None) or {}).get("model_id"))
        label = member.label if member else None
        log.debug("%s answered by %s", self.name, label)
        return label

    def sent(self, error: BaseException) -> bool:
        # Every deployment cooling down: the router refused the attempt itself, nothing was sent.
        return not isinstance(error, RouterRateLimitError)

    def refusal(self, error: BaseException) -> str | None:
        if isinstance(error, RouterRateLimitError) and self._circuit.all_refusing:
            # The router has no deployment to offer because every one refused and is cooling down.
            return "every deployment refused its latest attempt"
        return non_transient_reason(error)


class FleetBackend(PolicyBackend):
    """A judge served by several deployments of one model, routed by litellm's ``Router``."""

    sender: FleetSender
    circuit: FleetCircuit

    def __init__(self, settings: LiteLLMSettings, members: list[FleetMember], routing: FleetRouting) -> None:
        super().__init__(FleetSender(settings, members, routing), settings)
