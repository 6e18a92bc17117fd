"""Judge profiles and turning a ``--judge`` value into a backend.

Accepted forms of ``--judge``:

- a profile name from ``judges/*.toml`` (``gpt-4o-mini``, ``glm-4.7``, ``embedded``, ...), or the
  path of a profile file of one's own (``my-fleet.toml``; a fleet lists its ``[[deployments]]``);
- a raw litellm model string (``openai/gpt-4.1-nano``, ``hosted_vllm/Qwen/Qwen3-8B`` with
  ``--api-base``, ``openai/<name>`` on any OpenAI-compatible ``--api-base``);
- ``scripted:RULES.json``;
- ``cascade:A[@CONFIDENCE],B[@CONFIDENCE],C`` — each stage settles the claims it judges with at
  least that confidence (default :data:`DEFAULT_CASCADE_CONFIDENCE`), the rest go to the next stage;
- ``vote:A,B,C`` — every member judges every claim, the majority label stands (ties:
  contradicted > baseless > entailed), see :mod:`rt4chart.judges.vote`;
- a calibrated profile (``kind = "calibrated"``, written by ``rt4 calibrate``): another judge
  (``judge = "vote:A,B,C"``, a profile name, a model string, ``scripted:RULES.json``) whose final claim
  verdicts are settled by a threshold on their unsupported score (:class:`CalibratedJudge`).

Every check that can fail (unknown name, missing API key or base URL, unreadable file) runs here,
before any work, and raises :class:`JudgeConfigError`; messages name environment variables, never
their values. litellm (slow to import) is imported only when a litellm judge is asked for.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import tomllib
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rt4chart.judges.budget import Ledger, MeteredBackend
from rt4chart.judges.cache import CachedBackend, JudgeCache, open_cache
from rt4chart.judges.embedded.model import HeadName, load_model
from rt4chart.judges.hub import ModelMissing, VerifierModel, require_pulled
from rt4chart.judges.model_names import litellm_model_names, surely_no_model
from rt4chart.judges.policy import CallSettings
from rt4chart.judges.scripted import ScriptedBackend
from rt4chart.protocol import TEXT_JUDGES, Backend, BackendWrapper, Capabilities, JudgeRequest, prompt_tokens
from rt4chart.resources import resource_dir
from rt4chart.scrubbing import redact_url

if TYPE_CHECKING:
    from rt4chart.judges.batch import BatchSettings
    from rt4chart.judges.litellm import LiteLLMSettings
    from rt4chart.judges.openai_compat import OpenAICompatSettings
    from rt4chart.options import AuditOptions

DEFAULT_JUDGE = "embedded"
"""The judge used when none is named: needs no key and no network."""

DEFAULT_CASCADE_CONFIDENCE = 0.8
"""Confidence at which a cascade stage settles a claim when the spec gives none."""

NO_KEY = "no-key"
"""Placeholder key sent to servers that need none, so litellm never falls back to a key from the
environment (which would send, say, an OpenAI key to an arbitrary ``--api-base``)."""


class JudgeConfigError(ValueError):
    """The judge cannot be used as specified (unknown name, missing key, bad rules file)."""


class JudgeDeployment(BaseModel):
    """One deployment of a judge fleet (a ``[[deployments]]`` table of a profile): where the
    profile's model is also served, with that server's own key and rate limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    """litellm model string of this deployment (default: the profile's ``model``); the model must be
    the same, only its provider prefix or served name may differ."""
    api_base: str | None = None
    """Base URL of this deployment; ``None`` with no ``api_base_env``: the provider's default."""
    api_base_env: str | None = None
    """Environment variable holding the base URL."""
    api_key_env: str | None = None
    """Environment variable holding this deployment's key (sent to its base URL only)."""
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute this deployment accepts."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute this deployment accepts."""


class JudgeProfile(CallSettings):
    """How to call one judge: one ``judges/<name>.toml`` file. Prices, pacing and retries are the
    fields of :class:`~rt4chart.judges.policy.CallSettings`, declared there once."""

    name: str
    """Name used with ``--judge`` and recorded in outputs."""
    description: str = ""
    """One line for ``rt4 judges``."""
    kind: Literal["litellm", "embedded", "verifier", "calibrated"] = "litellm"
    """``litellm`` for any model litellm can call; ``embedded`` for the offline verifier; ``verifier`` for a
    pair- or token-classifier checkpoint from the Hugging Face hub (:attr:`verifier`, pulled once with ``rt4 models
    pull``); ``calibrated`` for the judge named by :attr:`judge` at the operating point :attr:`claim_threshold`."""
    adapter: Literal["lynx", "bespoke-minicheck", "granite-guardian", "granite-guardian-3.3"] | None = None
    """A chat model trained to verify (``litellm`` profiles), asked each claim in its own prompt
    (:mod:`rt4chart.judges.chat_verifiers`): ``lynx`` reads Patronus' Lynx's PASS/FAIL reply;
    ``bespoke-minicheck`` reads Bespoke-MiniCheck's one-token Yes/No from its log probabilities (the
    server must return ``logprobs``); ``granite-guardian`` (3.0-3.2) and ``granite-guardian-3.3`` ask
    Granite Guardian's groundedness risk through the model's own chat template; ``None``: the model gets
    rt4chart's prompts."""
    max_model_len: int | None = Field(default=None, ge=1)
    """Chat verifiers only: the server's context length in tokens; the sentences in view are cut into
    chunks that keep every call within it, and a claim takes its best chunk's verdict. ``None``: the
    whole context in view is one call (a longer one is refused by the server)."""
    verifier: VerifierModel | None = None
    """Verifier profiles only: the checkpoint (hub repository, pinned revision, family, token limits)."""
    api: Literal["auto", "openai-compatible", "litellm"] = "auto"
    """How the model is called. ``openai-compatible``: OpenAI's chat-completions protocol over aiohttp
    (:mod:`rt4chart.judges.openai_compat`; no litellm import), at the base URL or OpenAI's own;
    ``litellm``: through litellm; ``auto``: ``openai-compatible`` for a model at a base URL
    (``--api-base`` or the profile's) named ``openai/...``, ``hosted_vllm/...`` or with no provider
    prefix, ``litellm`` otherwise. A fleet is always routed by litellm."""
    model: str | None = None
    """litellm model string (``gpt-4o-mini``, ``zai/glm-4.7``, ``hosted_vllm/<model>``)."""
    api_base: str | None = None
    """Base URL of the server; ``None`` means the provider's default."""
    api_base_env: str | None = None
    """Environment variable holding the base URL (used when ``api_base`` and ``--api-base`` are not given)."""
    api_key_env: str | None = None
    """Environment variable holding the API key; ``None`` when the server needs none."""
    logprobs: bool = False
    """Whether the model can return token log-probabilities."""
    languages: list[str] | None = None
    """The languages (ISO 639-1 codes) the judge serves, for ``rt4 judges``; ``None``: any the model
    reads (its prompts name the answer's language). The embedded verifier's own ``languages``
    decide what it refuses; this field only describes it."""
    deployments: list[JudgeDeployment] = Field(default_factory=list)
    """Several deployments of ``model`` (a fleet, routed by litellm's Router); empty: one endpoint
    (``api_base``). The judge's name stays the profile's, whichever deployment answers."""
    routing_strategy: Literal["simple-shuffle", "least-busy", "usage-based-routing", "latency-based-routing"] = (
        "simple-shuffle"
    )
    """How a fleet picks a deployment for each attempt (litellm Router's strategies)."""
    allowed_fails: int = Field(default=1, ge=0)
    """Failures a fleet deployment may have within a minute before it is cooled down."""
    cooldown_s: float = Field(default=30.0, ge=0.0)
    """Seconds a failing fleet deployment gets no calls (a 429's Retry-After, when given, decides)."""
    claim_thresholds: dict[HeadName, Annotated[float, Field(ge=0.0, le=1.0)]] = Field(default_factory=dict)
    """Embedded judge only: per head of the verifier (``question``: answers with a question;
    ``no_question``: the others), the P(not entailed) at or above which the head calls a claim not
    entailed, in place of its trained threshold (what ``rt4 calibrate`` writes; empty: the trained ones)."""
    judge: str | None = None
    """Calibrated profile only: the judge whose verdicts :attr:`claim_threshold` settles, as ``--judge``
    takes it (a profile name or file, a model string, ``scripted:RULES.json``, ``vote:A,B,C``; files are
    read from the working directory, as ``--judge`` reads them). Not a cascade (its records hold only the
    settling stage's verdict), not the embedded judge (:attr:`claim_thresholds` moves its head), not
    another calibrated profile. With ``api_base``, the judge is called at that base URL (``--api-base``)."""
    claim_threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    """Calibrated profile only: the unsupported score (:func:`rt4chart.method.settlement.claim_unsupported_score`
    of a claim's final verdict: the judge's confidence when it is not entailed, 1 - its confidence when
    entailed; a vote's is its winning label's share of members) at or above which a claim is not
    entailed (:func:`rt4chart.method.settlement.settle_at_threshold`); what ``rt4 calibrate`` writes."""

    @model_validator(mode="after")
    def _litellm_needs_model(self) -> JudgeProfile:
        if self.kind == "litellm" and not self.model:
            raise ValueError(f"judge profile {self.name!r} needs a litellm model string")
        if self.adapter is not None and self.kind != "litellm":
            raise ValueError(f"judge profile {self.name!r}: an adapter wraps a chat model (kind = \"litellm\")")
        if self.max_model_len is not None and self.adapter is None:
            raise ValueError(f"judge profile {self.name!r}: max_model_len applies to chat verifiers (an adapter)")
        if (self.kind == "verifier") != (self.verifier is not None):
            raise ValueError(f"judge profile {self.name!r}: a [verifier] table belongs to, and is needed by, "
                             'kind = "verifier"')
        if self.kind != "embedded" and self.claim_thresholds:
            raise ValueError(f"judge profile {self.name!r}: claim_thresholds apply to the embedded judge only")
        calibrated = (self.judge is not None, self.claim_threshold is not None)
        if self.kind == "calibrated" and not all(calibrated):
            raise ValueError(f"judge profile {self.name!r}: a calibrated profile names a judge and a claim_threshold")
        if self.kind != "calibrated" and any(calibrated):
            raise ValueError(f"judge profile {self.name!r}: judge and claim_threshold belong to calibrated profiles "
                             '(kind = "calibrated")')
        return self

    def litellm_settings(self, concurrency: int | None = None) -> LiteLLMSettings:
        """The transport settings of this profile's litellm backend (``concurrency`` overrides)."""
        from rt4chart.judges.litellm import LiteLLMSettings

        return LiteLLMSettings(**self._call_settings(concurrency))

    def openai_compat_settings(self, concurrency: int | None = None) -> OpenAICompatSettings:
        """The transport settings of this profile's OpenAI-compatible backend (``concurrency`` overrides)."""
        from rt4chart.judges.openai_compat import OpenAICompatSettings

        return OpenAICompatSettings(**self._call_settings(concurrency))

    def _call_settings(self, concurrency: int | None) -> dict[str, Any]:
        assert self.model is not None, "litellm judge profiles always name a model"
        call = self.model_dump(include=set(CallSettings.model_fields) - {"concurrency"})
        if self.model.startswith(ANTHROPIC_PREFIX):
            call.update(anthropic_cache_prices(call))
        return {"name": self.name, "model": self.model, "concurrency": concurrency or self.concurrency, **call}

    def openai_compatible_at(self, base: str | None) -> bool:
        """Whether this profile's model, served at ``base``, is called over the OpenAI-compatible
        transport rather than litellm (see :attr:`api`)."""
        if self.api != "auto":
            return self.api == "openai-compatible"
        return base is not None and model_speaks_openai(self.model or "")


OPENAI_COMPATIBLE_PREFIXES = ("openai/", "hosted_vllm/")
"""Model-string prefixes (litellm's provider names) of servers that speak OpenAI's protocol."""


def model_speaks_openai(model: str) -> bool:
    """Whether a server at a base URL given for ``model`` speaks OpenAI's protocol: an
    ``openai/`` or ``hosted_vllm/`` model string, or a bare model name (litellm's ``gpt-4o-mini``)."""
    return model.startswith(OPENAI_COMPATIBLE_PREFIXES) or "/" not in model


class ProfileStatus(BaseModel):
    """Whether a profile can be used on this machine now (for ``rt4 judges``)."""

    profile: JudgeProfile
    """The profile."""
    key_set: bool | None
    """Whether its API-key variable is set; ``None`` when it needs no key."""
    base_set: bool | None
    """Whether its base-URL variable is set; ``None`` when it needs none."""


def load_profiles(directory: Path | None = None) -> dict[str, JudgeProfile]:
    """Read every ``*.toml`` profile of ``directory`` (default: the shipped ``judges`` folder)."""
    folder = directory or resource_dir("judges")
    profiles: dict[str, JudgeProfile] = {}
    for path in sorted(folder.glob("*.toml")):
        try:
            profile = JudgeProfile.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
        except (OSError, tomllib.TOMLDecodeError, ValidationError) as error:
            raise JudgeConfigError(f"cannot use judge profile {str(path)!r}: {error}") from error
        profiles[profile.name] = profile
    return profiles


def _env_set(variable: str | None) -> bool | None:
    return None if variable is None else bool(os.environ.get(variable))


def profile_statuses(directory: Path | None = None) -> list[ProfileStatus]:
    """Every profile with whether its key and base URL are available (values never read out)."""
    return [
        ProfileStatus(
            profile=profile,
            key_set=_env_set(profile.api_key_env),
            base_set=None if profile.api_base else _env_set(profile.api_base_env),
        )
        for profile in load_profiles(directory).values()
    ]


def resolve_judge(
    spec: str | None = None,
    *,
    api_base: str | None = None,
    concurrency: int | None = None,
    wrap: Callable[[Backend], Backend] | None = None,
    timeout_s: float | None = None,
    batch: BatchSettings | None = None,
) -> Backend:
    """Build the backend named by ``spec`` (default :data:`DEFAULT_JUDGE`).

    ``api_base``, ``concurrency`` and ``timeout_s`` (seconds per HTTP attempt) override the judge
    profile; ``batch`` sends every model call through the provider's Batch API
    (:mod:`rt4chart.judges.batch`); ``wrap`` is applied to every
    model-calling backend (each stage of a cascade) and is how the disk cache and the budget are
    put in front of the calls. Raises :class:`JudgeConfigError` before any work when the judge
    cannot be used (unknown name, missing API key, unreadable rules file).
    """
    spec = spec or DEFAULT_JUDGE
    if concurrency is not None and concurrency < 1:
        raise JudgeConfigError(f"concurrency must be at least 1 (got {concurrency})")
    calibrated = _calibrated_profile(spec)
    if calibrated is not None:
        return _calibrated_judge(calibrated, api_base, concurrency, wrap, timeout_s, batch)
    settings = LeafSettings(api_base=api_base, concurrency=concurrency, timeout_s=timeout_s, wrap=wrap, batch=batch)
    for scheme, build in ENSEMBLE_SCHEMES.items():
        if spec.startswith(scheme):
            return build(spec, settings)
    return _resolve_leaf(spec, settings)


_PRICING_ONLY: ContextVar[bool] = ContextVar("rt4chart_pricing_only", default=False)
"""Set while :func:`resolve_judge_for_pricing` builds a judge that will never be called."""


def resolve_judge_for_pricing(
    spec: str | None = None, *, api_base: str | None = None, batch: bool = False
) -> Backend:
    """The judge named by ``spec`` for pricing an audit (``rt4 estimate``): as :func:`resolve_judge`
    (through the Batch API, at its prices, under ``batch``), except that a missing API key is no
    error. The backend is never called, so no key is needed to count tokens and read prices (the
    placeholder :data:`NO_KEY` stands in for it); every other check (unknown judge, missing base URL)
    still applies."""
    token = _PRICING_ONLY.set(True)
    try:
        if not batch:
            return resolve_judge(spec, api_base=api_base)
        from rt4chart.judges.batch import BatchSettings

        return resolve_judge(spec, api_base=api_base, batch=BatchSettings())
    finally:
        _PRICING_ONLY.reset(token)


def parse_cascade(spec: str) -> list[tuple[str, float]]:
    """``cascade:A@0.9,B`` -> ``[("A", 0.9), ("B", DEFAULT_CASCADE_CONFIDENCE)]``.

    The last stage settles whatever reaches it, so its confidence is never used. An ``@`` whose
    suffix is not a number in [0, 1] belongs to the model string (e.g. Vertex model versions).
    """
    stages: list[tuple[str, float]] = []
    for part in spec.removeprefix("cascade:").split(","):
        name, _, suffix = part.strip().rpartition("@")
        try:
            confidence = float(suffix) if name else None
        except ValueError:
            confidence = None
        if confidence is None or not 0.0 <= confidence <= 1.0:
            name, confidence = part.strip(), DEFAULT_CASCADE_CONFIDENCE
        if not name or name.startswith("cascade:"):
            raise JudgeConfigError(f"bad cascade stage {part!r} in {spec!r}")
        stages.append((name, confidence))
    if len(stages) < 2:
        raise JudgeConfigError(f"a cascade needs at least two stages: {spec!r}")
    return stages


@dataclass(frozen=True)
class LeafSettings:
    """What a run overrides in every judge it resolves (``--api-base``, ``--concurrency``,
    ``--timeout``), and the wrapper put in front of each model-calling judge (cache and budget)."""

    api_base: str | None = None
    concurrency: int | None = None
    timeout_s: float | None = None
    wrap: Callable[[Backend], Backend] | None = None
    batch: BatchSettings | None = None
    """Send the model calls through the provider's Batch API (``--batch``); ``None``: online."""


def _resolve_leaf(spec: str, settings: LeafSettings) -> Backend:
    backend = _build_leaf(spec, settings)
    return settings.wrap(backend) if settings.wrap else backend


def _build_leaf(spec: str, settings: LeafSettings) -> Backend:
    for scheme, build in SPEC_SCHEMES.items():
        if spec.startswith(scheme):
            return build(spec.removeprefix(scheme), settings)
    profiles = load_profiles()
    profile = profiles.get(spec) or _profile_file(spec) or _profile_for_model(spec, profiles, settings.api_base)
    return PROFILE_KINDS[profile.kind](profile, settings)


def _cascade(spec: str, settings: LeafSettings) -> Backend:
    from rt4chart.judges.cascade import CascadeBackend, CascadeStage

    return CascadeBackend([
        CascadeStage(backend=_resolve_leaf(stage, settings), confidence=confidence)
        for stage, confidence in parse_cascade(spec)
    ])


def _vote(spec: str, settings: LeafSettings) -> Backend:
    from rt4chart.judges.vote import VoteBackend

    members = [member.strip() for member in spec.removeprefix("vote:").split(",")]
    nested = any(member.startswith(tuple(ENSEMBLE_SCHEMES)) for member in members)
    if len(members) < 2 or not all(members) or nested:
        raise JudgeConfigError(f"a vote needs at least two member judges (no nested vote: or cascade:): {spec!r}")
    return VoteBackend([_resolve_leaf(member, settings) for member in members])


def _scripted(rules: str, settings: LeafSettings) -> Backend:
    if not rules:
        raise JudgeConfigError("scripted judge needs a rules file: --judge scripted:RULES.json")
    try:
        return ScriptedBackend.from_file(rules)
    except ValueError as error:
        raise JudgeConfigError(str(error)) from error


def _embedded(profile: JudgeProfile, settings: LeafSettings) -> Backend:
    return _embedded_backend(profile.claim_thresholds)


VERIFIER_PARTS = ("torch", "transformers", "huggingface_hub", "safetensors")
"""Packages of the verifiers extra a hub verifier imports when it loads (on the first request)."""


def _verifier(profile: JudgeProfile, settings: LeafSettings) -> Backend:
    assert profile.verifier is not None, "validated by the profile"
    # Looked for, not imported (torch takes seconds): a missing part or a checkpoint never pulled is a
    # usage error before the run, not an error on every record.
    missing = [part for part in VERIFIER_PARTS if importlib.util.find_spec(part) is None]
    if missing:
        raise JudgeConfigError(f"the verifier {profile.name!r} needs {', '.join(missing)}: "
                               "pip install 'rt4chart[verifiers]'")
    try:
        record = require_pulled(profile.name)
    except ModelMissing as error:
        raise JudgeConfigError(str(error)) from error
    if profile.verifier.family == "lettucedetect":
        from rt4chart.judges.token_classifier import TokenClassifierBackend

        return TokenClassifierBackend(profile.name, profile.verifier, record)
    from rt4chart.judges.pair_classifier import PairClassifierBackend

    return PairClassifierBackend(profile.name, profile.verifier, record)


def verifier_profile(name: str) -> JudgeProfile:
    """The verifier profile ``name`` (a shipped name or a profile file), for ``rt4 models pull``;
    :class:`JudgeConfigError` naming the verifier profiles when it is none."""
    profiles = load_profiles()
    profile = profiles.get(name) or _profile_file(name)
    if profile is None or profile.verifier is None:
        known = ", ".join(sorted(p.name for p in profiles.values() if p.verifier is not None))
        raise JudgeConfigError(f"{name!r} is no verifier profile (these are: {known})")
    return profile


def _calibrated_leaf(profile: JudgeProfile, settings: LeafSettings) -> Backend:
    raise JudgeConfigError(f"the calibrated profile {profile.name!r} cannot be a stage of a cascade or a member of a "
                           "vote (it settles a whole judge's final verdicts): name the judge it calibrates")


def _model(profile: JudgeProfile, settings: LeafSettings) -> Backend:
    if settings.timeout_s is not None:
        profile = profile.model_copy(update={"timeout_s": settings.timeout_s})
    backend = _litellm_backend(profile, settings.api_base, settings.concurrency, settings.batch)
    if profile.adapter is None:
        return backend
    from rt4chart.judges.chat_verifiers import ChatVerifierBackend

    return ChatVerifierBackend(backend, profile.adapter, profile.max_model_len)


ENSEMBLE_SCHEMES: dict[str, Callable[[str, LeafSettings], Backend]] = {"cascade:": _cascade, "vote:": _vote}
"""Judges made of judges, by the scheme their spec starts with (the spec whole is passed on)."""
SPEC_SCHEMES: dict[str, Callable[[str, LeafSettings], Backend]] = {"scripted:": _scripted}
"""Judges named by a scheme of the spec and built from the rest of it (``scripted:RULES.json``)."""
PROFILE_KINDS: dict[str, Callable[[JudgeProfile, LeafSettings], Backend]] = {
    "litellm": _model,
    "embedded": _embedded,
    "verifier": _verifier,
    "calibrated": _calibrated_leaf,
}
"""Judges built from a profile (shipped, a file, or made for a model string), by the profile's ``kind``:
a language model behind the transport policy (litellm, the OpenAI-compatible client or a fleet, as the
profile says), the embedded verifier, a pulled hub verifier, or a calibrated profile (a whole judge only,
never a leaf)."""


def _profile_file(spec: str) -> JudgeProfile | None:
    """A profile of the user's own (``--judge my-fleet.toml``), or ``None`` when ``spec`` names no such file."""
    path = Path(spec)
    if path.suffix != ".toml" or not path.is_file():
        return None
    try:
        return JudgeProfile.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except (OSError, tomllib.TOMLDecodeError, ValidationError) as error:
        raise JudgeConfigError(f"cannot use judge profile {spec!r}: {error}") from error


def _calibrated_profile(spec: str) -> JudgeProfile | None:
    """The calibrated profile ``spec`` names (a shipped name or a profile file), else ``None``."""
    if spec.startswith(("cascade:", "vote:", "scripted:")):
        return None
    profile = load_profiles().get(spec) or _profile_file(spec)
    return profile if profile is not None and profile.kind == "calibrated" else None


CALIBRATED_MARK = "+unsupported>="
"""What a calibrated judge's name adds to its judge's name, before the threshold."""


class CalibratedJudge(BackendWrapper):
    """A judge at a calibrated operating point (a ``kind = "calibrated"`` profile): its calls, replies
    and cache keys are the judge's own (the threshold acts after them), and the method settles each
    claim's final verdict by :attr:`claim_threshold` (:func:`rt4chart.method.settlement.settle_at_threshold`,
    before the AND-join). The threshold is in its name, so records and ``--resume``/``--baseline``
    fingerprints tell a calibrated run apart from the judge's own."""

    def __init__(self, inner: Backend, claim_threshold: float) -> None:
        super().__init__(inner)
        self.claim_threshold = claim_threshold
        """The unsupported score at or above which a claim's final verdict is not entailed."""

    @property
    def name(self) -> str:
        return f"{self.inner.name}{CALIBRATED_MARK}{self.claim_threshold:g}"

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities.model_copy(update={"claim_threshold": self.claim_threshold})

    def count_prompt_tokens(self, request: JudgeRequest) -> int:
        """The judge's own count (``rt4 estimate`` prices the calibrated judge as the judge)."""
        return prompt_tokens(self.inner, request)


def _calibrated_judge(
    profile: JudgeProfile, api_base: str | None, concurrency: int | None,
    wrap: Callable[[Backend], Backend] | None, timeout_s: float | None, batch: BatchSettings | None,
) -> Backend:
    assert profile.judge is not None and profile.claim_threshold is not None, "validated by the profile"
    judge = profile.judge.strip()

    def refused(why: str) -> JudgeConfigError:
        return JudgeConfigError(f"the calibrated profile {profile.name!r} cannot settle judge {judge!r}: {why}")

    if judge.startswith("cascade:"):
        raise refused("a cascade's records hold only the verdict of the stage that settled each claim")
    if _calibrated_profile(judge) is not None:
        raise refused("it is itself a calibrated profile: name the judge it calibrates")
    inner = resolve_judge(judge, api_base=api_base or profile.api_base, concurrency=concurrency, wrap=wrap,
                          timeout_s=timeout_s, batch=batch)
    if inner.name.startswith("embedded#"):
        raise refused("the embedded judge applies its threshold inside its head: give its profile claim_thresholds")
    return CalibratedJudge(inner, profile.claim_threshold)


EMBEDDED_PARTS = ("safetensors", "tokenizers", "threadpoolctl")
"""Packages of the embedded extra the encoder imports when it loads (on the first request)."""


def _embedded_backend(thresholds: dict[HeadName, float]) -> Backend:
    try:
        from rt4chart.judges.embedded.verifier import INSTALL_HINT, EmbeddedBackend, model_dir
    except ImportError as error:
        raise JudgeConfigError(
            f"the embedded verifier is not installed ({error}); pip install 'rt4chart[embedded]'"
        ) from error
    try:
        # The encoder loads on the first request; what it needs is looked for now (no import), so a
        # missing part is a usage error before the run, not an error on every record.
        missing = [part for part in EMBEDDED_PARTS if importlib.util.find_spec(part) is None]
        if missing:
            raise ImportError(f"the embedded verifier needs {', '.join(missing)}: {INSTALL_HINT}")
        model_dir()
        if not thresholds:
            return EmbeddedBackend()
        from rt4chart.judges.embedded.verifier import VERSION

        # The thresholds are in the name: records, and the cache's keys, tell the calibrated judge apart.
        moved = ",".join(f"{head}={value:g}" for head, value in sorted(thresholds.items()))
        return EmbeddedBackend(name=f"embedded#{VERSION}+{moved}", model=load_model().with_thresholds(thresholds))
    except (OSError, ImportError) as error:
        raise JudgeConfigError(f"cannot load the embedded verifier: {error}") from error


def _profile_for_model(model: str, profiles: dict[str, JudgeProfile], api_base: str | None) -> JudgeProfile:
    """A profile for a raw litellm model string: a shipped profile with that model, else a new one."""
    shipped = next((p for p in profiles.values() if p.model == model), None)
    if shipped is not None:
        return shipped
    if api_base is not None and model.startswith(OPENAI_COMPATIBLE_PREFIXES):
        # The user's own OpenAI-compatible server: no provider to route and no key variable to
        # check (its key, if any, belongs in a profile), so litellm is never imported. (A bare
        # name still goes through litellm's routing, which tells a model from a mistyped profile.)
        return JudgeProfile(name=model, model=model)
    if surely_no_model(model):
        raise _unknown_judge(model, profiles)  # without importing litellm (seconds)
    from rt4chart.judges.litellm import litellm_provider, missing_key_variables

    provider = litellm_provider(model)
    if provider is None:
        raise _unknown_judge(model, profiles)
    # With --api-base the server is the user's own; its key (if any) belongs in a profile.
    missing = [] if api_base or _PRICING_ONLY.get() else missing_key_variables(model)
    if missing:
        raise JudgeConfigError(f"judge {model!r} needs the environment variable {missing[0]}, which is not set")
    if provider == "hosted_vllm" and not api_base:
        raise JudgeConfigError(f"judge {model!r} needs --api-base http://HOST:PORT/v1 (the vLLM server)")
    return JudgeProfile(name=model, model=model)


def _unknown_judge(name: str, profiles: dict[str, JudgeProfile]) -> JudgeConfigError:
    """The error for a ``--judge`` that names nothing, with the closest profile or model name."""
    known = ", ".join(sorted(profiles))
    close = difflib.get_close_matches(name, [*profiles, *(litellm_model_names() or ())], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return JudgeConfigError(
        f"unknown judge {name!r}: not a profile ({known}), not a litellm model string "
        f"(e.g. openai/<model>, hosted_vllm/<model>), not scripted:RULES.json, cascade:A,B or vote:A,B,C{hint}"
    )


def _litellm_backend(
    profile: JudgeProfile, api_base: str | None, concurrency: int | None, batch: BatchSettings | None = None
) -> Backend:
    if profile.deployments:
        if batch is not None:
            raise JudgeConfigError(f"judge {profile.name!r} is a fleet: --batch needs one OpenAI-compatible endpoint")
        return _fleet_backend(profile, api_base, concurrency)
    base = api_base or profile.api_base
    if base is None and profile.api_base_env:
        base = os.environ.get(profile.api_base_env) or None
        if base is None:
            raise JudgeConfigError(
                f"judge {profile.name!r} needs its server's base URL: set {profile.api_base_env} "
                "or pass --api-base"
            )
    if base is not None and urlsplit(base).netloc.rpartition("@")[1]:
        # The HTTP client refuses credentials in the URL beside its Authorization header on every
        # attempt: refused here, once, before any work, never retried as if the server had failed.
        raise JudgeConfigError(
            f"the base URL {redact_url(base)} holds credentials (user:password@); give the key through "
            "the profile's key variable instead"
        )
    api_key: str | None = None
    # A key goes only to the endpoint its profile names: a --api-base of the user's own choosing
    # gets the placeholder, never the profile's cloud key (which that server could log or echo).
    named_base = profile.api_base or (os.environ.get(profile.api_base_env) if profile.api_base_env else None)
    user_server = api_base is not None and api_base != named_base
    if user_server:
        api_key = NO_KEY
    elif profile.api_key_env:
        api_key = os.environ.get(profile.api_key_env) or None
        if api_key is None and _PRICING_ONLY.get():
            api_key = NO_KEY
        if api_key is None:
            raise JudgeConfigError(
                f"judge {profile.name!r} needs the environment variable {profile.api_key_env}, which is not set"
            )
    elif base is not None:
        api_key = NO_KEY
    if batch is not None:
        return _batch_backend(profile, base, api_key, batch)
    if profile.openai_compatible_at(base):
        from rt4chart.judges.openai_compat import OpenAICompatBackend

        return OpenAICompatBackend(profile.openai_compat_settings(concurrency), api_key=api_key, api_base=base)
    from rt4chart.judges.litellm import LiteLLMBackend

    return LiteLLMBackend(profile.litellm_settings(concurrency), api_key=api_key, api_base=base)


def _batch_backend(profile: JudgeProfile, base: str | None, api_key: str | None, batch: BatchSettings) -> Backend:
    """The profile's model through an OpenAI-compatible Batch API (OpenAI's own without a base URL),
    or Anthropic's Message Batches for an ``anthropic/...`` model. Its name is the online judge's
    (so are its cache keys); its prices the batch rate; its calls in flight every request a round
    holds (the provider, not the client, paces a batch)."""
    from rt4chart.judges.batch import BATCH_PRICE_FACTOR, MAX_BATCH_REQUESTS, BatchSender
    from rt4chart.judges.policy import PolicyBackend

    if (profile.model or "").startswith(ANTHROPIC_PREFIX):
        return _anthropic_batch_backend(profile, base, api_key, batch)
    speaks_openai = profile.openai_compatible_at(base) or (base is None and model_speaks_openai(profile.model or ""))
    if not speaks_openai:
        raise JudgeConfigError(
            "--batch needs a judge served over OpenAI's protocol (OpenAI, or a server with /v1/batches) or an "
            f"anthropic/ model (Message Batches): "
            f"{profile.name!r} ({profile.model}) is not"
        )
    settings = profile.openai_compat_settings(MAX_BATCH_REQUESTS)
    prices = {
        field: price * BATCH_PRICE_FACTOR
        for field in PRICE_FIELDS
        if (price := getattr(settings, field)) is not None
    }
    # Every call of a round reaches the collector at once (no pacing: the provider paces a batch).
    # No backoff before another attempt: a re-ask or a retry joins the next round at once, with the
    # other samples' calls, instead of a round of its own after its jittered wait (a Retry-After
    # the provider sends on a refused upload is still honoured).
    settings = settings.model_copy(update={**prices, "backoff_s": 0.0, "adaptive_concurrency": False})
    return PolicyBackend(BatchSender(settings, api_key=api_key, api_base=base, batch=batch), settings)


ANTHROPIC_PREFIX = "anthropic/"
"""The model-string prefix of Anthropic's models (litellm's provider name): Message Batches under ``--batch``."""

ANTHROPIC_KEY_ENV = "ANTHROPIC_API_KEY"
"""Where an Anthropic model string without a profile finds its key (litellm's variable)."""


def _anthropic_batch_backend(
    profile: JudgeProfile, base: str | None, api_key: str | None, batch: BatchSettings
) -> Backend:
    """An ``anthropic/...`` judge on Anthropic's Message Batches (:mod:`rt4chart.judges.anthropic_batch`),
    named as the online judge (so are its cache keys), priced at the batch rate: the profile's
    prices, else litellm's table; cache reads at 0.1x and writes at 1.25x the input price unless
    either says otherwise; all of it halved."""
    from rt4chart.judges.anthropic_batch import MAX_ANTHROPIC_BATCH_REQUESTS, AnthropicBatchSender
    from rt4chart.judges.batch import BATCH_PRICE_FACTOR
    from rt4chart.judges.policy import PolicyBackend

    if api_key is None:  # Anthropic's own endpoint, named by a model string: litellm's key variable
        api_key = os.environ.get(ANTHROPIC_KEY_ENV) or (NO_KEY if _PRICING_ONLY.get() else None)
        if api_key is None:
            raise JudgeConfigError(f"judge {profile.name!r} needs the environment variable {ANTHROPIC_KEY_ENV}, "
                                   "which is not set")
    settings = profile.openai_compat_settings(MAX_ANTHROPIC_BATCH_REQUESTS)
    prices = settings.model_dump(include=set(PRICE_FIELDS))
    if settings.per_token_prices() is None:  # no prices of the profile's own: litellm's table
        prices.update(anthropic_cache_prices(_litellm_table_prices(profile.model or "")))
    batch_prices = {field: price * BATCH_PRICE_FACTOR for field, price in prices.items() if price is not None}
    # As for OpenAI's batches: no pacing and no backoff, every call of a round reaches the collector.
    settings = settings.model_copy(update={**batch_prices, "backoff_s": 0.0, "adaptive_concurrency": False})
    return PolicyBackend(AnthropicBatchSender(settings, api_key=api_key, api_base=base, batch=batch), settings)


PRICE_FIELDS = ("input_usd_per_mtok", "output_usd_per_mtok", "cached_input_usd_per_mtok", "cache_write_usd_per_mtok")
"""The per-million prices of :class:`~rt4chart.judges.policy.CallSettings`."""


def anthropic_cache_prices(prices: dict[str, Any]) -> dict[str, float]:
    """``prices`` (the fields of :data:`PRICE_FIELDS` that are set) with Anthropic's cache rates
    where they are not: reads at 0.1x, writes at 1.25x the input price."""
    from rt4chart.judges.prompt_cache import CACHE_READ_FACTOR, CACHE_WRITE_FACTOR

    filled = {field: float(price) for field, price in prices.items() if field in PRICE_FIELDS and price is not None}
    if (input_price := filled.get("input_usd_per_mtok")) is not None:
        filled.setdefault("cached_input_usd_per_mtok", input_price * CACHE_READ_FACTOR)
        filled.setdefault("cache_write_usd_per_mtok", input_price * CACHE_WRITE_FACTOR)
    return filled


def _litellm_table_prices(model: str) -> dict[str, float]:
    """Per-million prices of ``model`` in litellm's table (prompt, completion, cache read, cache write);
    none when it does not list the model."""
    import litellm

    try:
        info = dict(litellm.get_model_info(model=model))
    except Exception:  # litellm raises for a model it has no price for
        return {}
    fields = {
        "input_usd_per_mtok": "input_cost_per_token", "output_usd_per_mtok": "output_cost_per_token",
        "cached_input_usd_per_mtok": "cache_read_input_token_cost",
        "cache_write_usd_per_mtok": "cache_creation_input_token_cost",
    }
    listed = {ours: info.get(theirs) for ours, theirs in fields.items()}
    return {ours: float(price) * 1e6 for ours, price in listed.items() if isinstance(price, int | float)}


def _fleet_backend(profile: JudgeProfile, api_base: str | None, concurrency: int | None) -> Backend:
    """A fleet profile's backend: every deployment's base URL and key resolved here, each key kept
    with its own deployment."""
    if api_base is not None:
        raise JudgeConfigError(f"judge {profile.name!r} is a fleet that names its servers; --api-base does not apply")
    from rt4chart.judges.fleet import FleetBackend, FleetMember, FleetRouting

    members = []
    for position, deployment in enumerate(profile.deployments, start=1):
        where = f"deployment {position} of judge {profile.name!r}"
        base = deployment.api_base
        if base is None and deployment.api_base_env:
            base = os.environ.get(deployment.api_base_env) or None
            if base is None:
                raise JudgeConfigError(f"{where} needs its server's base URL: set {deployment.api_base_env}")
        key: str | None = None
        if deployment.api_key_env:
            key = os.environ.get(deployment.api_key_env) or (NO_KEY if _PRICING_ONLY.get() else None)
            if key is None:
                raise JudgeConfigError(f"{where} needs the environment variable {deployment.api_key_env} (unset)")
        elif base is not None:
            key = NO_KEY
        members.append(FleetMember(deployment.model or profile.model or "", base, key, deployment.rpm, deployment.tpm))
    routing = FleetRouting(profile.routing_strategy, profile.allowed_fails, profile.cooldown_s)
    return FleetBackend(profile.litellm_settings(concurrency), members, routing)


class JudgeStack(BackendWrapper):
    """A judge ready for an audit: each model-calling stage metered against the ledger (the budget)
    behind the disk cache, so a cache hit never reserves budget and a refused reservation never
    reaches the model. Closing the stack closes what it opened: the judge it resolved from a spec
    (not a backend handed to it) and the cache it opened from a directory (not one handed to it)."""

    def __init__(
        self, inner: Backend, ledger: Ledger, cache: JudgeCache | None, *, owns_judge: bool, owns_cache: bool
    ) -> None:
        super().__init__(inner)
        self.ledger = ledger
        """Spend and reservations of every call made through the stack."""
        self.cache = cache
        """The cache in front of the calls, if any."""
        self._owns_judge = owns_judge
        self._owns_cache = owns_cache

    async def aclose(self) -> None:
        try:
            if self._owns_judge:
                await self.inner.aclose()
        finally:
            if self.cache is not None and self._owns_cache:
                self.cache.close()


def judge_stack(
    judge: str | Backend | None = None,
    *,
    api_base: str | None = None,
    concurrency: int | None = None,
    cache: JudgeCache | Path | str | None = None,
    budget_usd: float | None = None,
    ledger: Ledger | None = None,
    timeout_s: float | None = None,
    batch: BatchSettings | None = None,
) -> JudgeStack:
    """The judge an audit runs with: what ``rt4 verify``, :func:`rt4chart.averify`, ``rt4 eval`` and
    the benchmarks all build.

    ``judge`` is a spec as ``--judge`` takes it (default :data:`DEFAULT_JUDGE`), a backend of the
    caller's (wrapped whole), or a stack (shared as it is: its ledger, its cache, never closed here).
    ``cache`` is an open :class:`JudgeCache` (the caller closes it), a directory or a cache server's
    ``redis://`` URL (opened here, closed with the stack), or ``None`` for no cache. ``budget_usd`` caps
    the spend (``None``: no cap); several stacks share one spend and cap when given one ``ledger``
    instead (``rt4 compare``). ``timeout_s`` overrides the profile's seconds per HTTP attempt;
    ``batch`` sends the model calls through the provider's Batch API (:mod:`rt4chart.judges.batch`).
    Whoever builds a stack closes it (``await stack.aclose()``); the
    pipeline and the audit runners never close a backend they were given.
    """
    if isinstance(judge, JudgeStack):
        # A stack's calls are already metered against its ledger and cached: wrapping it again would
        # meter every call twice (a pytest session's stack audited through the run layer). The run
        # shares it, and its builder keeps closing it.
        if cache is not None or budget_usd is not None or ledger is not None:
            raise JudgeConfigError("a judge stack has its own cache and budget: give them when building it")
        return JudgeStack(judge.inner, judge.ledger, judge.cache, owns_judge=False, owns_cache=False)
    if ledger is None:
        ledger = Ledger(limit_usd=budget_usd)
    elif budget_usd is not None:
        raise ValueError("give the budget to the shared ledger, not to one stack")
    opened = isinstance(cache, (Path, str))
    disk = open_cache(cache) if isinstance(cache, (Path, str)) else cache

    def wrap(leaf: Backend) -> Backend:
        metered: Backend = MeteredBackend(leaf, ledger)
        return CachedBackend(metered, disk) if disk is not None else metered

    try:
        inner = wrap(judge) if isinstance(judge, Backend) else resolve_judge(
            judge, api_base=api_base, concurrency=concurrency, wrap=wrap, timeout_s=timeout_s, batch=batch
        )
    except BaseException:
        if opened and disk is not None:
            disk.close()
        raise
    return JudgeStack(inner, ledger, disk, owns_judge=not isinstance(judge, Backend), owns_cache=opened)


def check_judge_serves(backend: Backend, options: AuditOptions) -> None:
    """Raise :class:`JudgeConfigError` when ``backend`` cannot serve a step ``options`` ask for.

    A judge that only verifies claims (the embedded verifier: ``can_write_text`` false) would
    answer every decomposition or direct request with an error, so the run would write all-null
    records and look like an unreachable judge; a usage error before any work says what to change.
    """
    capabilities = backend.capabilities
    if options.language is not None and (refusal := capabilities.language_refusal(options.language, backend.name)):
        raise JudgeConfigError(refusal)
    if options.method == "direct" and capabilities.claim_threshold is not None:
        raise JudgeConfigError(f"judge {backend.name!r} settles claim verdicts at a calibrated threshold; --method "
                               "direct judges no claim: use --method rt4chart, or the judge it calibrates")
    if capabilities.can_write_text:
        return
    if options.method == "direct":
        needs = "--method direct (one call that finds the hallucinated spans)"
    elif options.decomposer in ("judge", "holistic"):
        needs = f"--decomposer {options.decomposer} (claims written by the judge)"
    else:
        return
    raise JudgeConfigError(f"{needs} needs {TEXT_JUDGES}; judge {backend.name!r} only verifies claims")
