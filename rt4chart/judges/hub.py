"""Verifier checkpoints from the Hugging Face hub: where they are kept, pulling them once, finding them offline.

A verifier profile (``kind = "verifier"`` in ``judges/*.toml``) names a hub repository and a revision
(its ``[verifier]`` table, :class:`VerifierModel`). ``rt4 models pull NAME`` downloads the files the
backend reads (weights, config, tokenizer) through ``huggingface_hub`` into the models folder (beside
the judge-call cache: ``~/.cache/rt4chart/verifier-models`` on Linux), checks every weight file
against the sha256 the hub lists for it, and writes a pull record (:class:`PullRecord`: the commit
each revision resolved to and every file's sha256). Afterwards nothing is downloaded: the backend
reads the pulled commit's files and nothing else, so ``HF_HUB_OFFLINE`` changes nothing, and a
verifier that was never pulled is a usage error naming the pull command (:class:`ModelMissing`).

``HF_ENDPOINT`` (a mirror, or a local stand-in in the tests) is honoured by ``huggingface_hub`` itself.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field

PULL_RECORDS = "pulled"
"""Folder of the models folder holding one pull record per profile (``<name>.json``)."""

TOKENIZER_FILES = (
    "config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "spm.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json",
)
"""Files a checkpoint's tokenizer and config may need (whichever the repository has)."""

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
"""Weight files, by preference: safetensors when the repository has it (no pickle is read)."""


class ModelMissing(LookupError):
    """A verifier profile's checkpoint has not been pulled (or its files are gone)."""


class PullError(RuntimeError):
    """A pull that could not finish: the hub unreachable, the revision unknown, a file whose hash differs."""


class HubFile(BaseModel):
    """A repository at a revision (the HHEM head's tokenizer comes from another repository)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str
    """Hub repository id (``lytang/MiniCheck-RoBERTa-Large``)."""
    revision: str
    """A commit hash (pinned) or a branch (resolved to a commit when pulled, and recorded)."""


class VerifierModel(BaseModel):
    """The ``[verifier]`` table of a verifier profile: which checkpoint, read how, within which limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Literal["sequence-classification", "minicheck-t5", "hhem", "lettucedetect"]
    """How the checkpoint is run. ``sequence-classification``: ``AutoModelForSequenceClassification``
    over ``window + eos + claim`` (MiniCheck's RoBERTa and DeBERTa; label 1 = supported);
    ``minicheck-t5``: a seq2seq model fed ``predict: window + eos + claim``, one decoder step from the
    start token, softmax over the tokens ``▁`` (id 3, unsupported) and ``▁1`` (id 209, supported), as
    MiniCheck's Flan-T5 is run; ``hhem``: HHEM-2.1-open's head, a ``T5ForTokenClassification`` built from
    its foundation's config, fed HHEM's prompt, class 1 of the first token = consistent; ``lettucedetect``:
    an ``AutoModelForTokenClassification`` (ModernBERT) fed LettuceDetect's prompt and the claims as the
    answer, class 1 of an answer token = hallucinated (:mod:`rt4chart.judges.token_classifier`)."""
    weights: HubFile
    """The checkpoint's repository and revision."""
    tokenizer: HubFile | None = None
    """Where the tokenizer (and, for ``hhem``, the T5 config) comes from when not from :attr:`weights`."""
    max_tokens: int = Field(ge=16)
    """Tokens one model input may hold (template, window and claim): every request is kept inside it."""
    window_tokens: int = Field(ge=8)
    """Context tokens packed into one window (whole sentences, MiniCheck's chunking); a claim is
    supported when any window supports it (the max over windows, MiniCheck's aggregation)."""
    threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    """Support probability at or above which a claim is entailed (the checkpoints' own 0.5)."""

    def sources(self) -> list[HubFile]:
        """The repositories a pull downloads from (weights first)."""
        return [self.weights, *([self.tokenizer] if self.tokenizer else [])]


class PulledRepo(BaseModel):
    """One repository as pulled."""

    repo: str
    """Hub repository id."""
    revision: str
    """The revision the profile asked for."""
    commit: str
    """The commit it resolved to: what the backend reads from then on."""
    sha256: dict[str, str]
    """Every pulled file's sha256, by its name in the repository."""


class PullRecord(BaseModel):
    """What ``rt4 models pull`` wrote for one profile (``<models folder>/pulled/<name>.json``)."""

    profile: str
    """The verifier profile's name."""
    repos: list[PulledRepo]
    """The repositories pulled, weights first."""


def models_dir() -> Path:
    """Where pulled checkpoints are kept (``~/.cache/rt4chart/verifier-models`` on Linux; ``XDG_CACHE_HOME``
    moves it, as it moves the judge-call cache)."""
    return Path(platformdirs.user_cache_dir("rt4chart")) / "verifier-models"


def pull_command(profile: str) -> str:
    """The command that pulls ``profile``'s checkpoint."""
    return f"rt4 models pull {profile}"


def _record_path(profile: str, directory: Path) -> Path:
    return directory / PULL_RECORDS / f"{profile}.json"


def pulled(profile: str, directory: Path | None = None) -> PullRecord | None:
    """``profile``'s pull record when its files are all on disk, else ``None``."""
    folder = directory or models_dir()
    path = _record_path(profile, folder)
    try:
        record = PullRecord.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    every_file = all(
        (snapshot_dir(repo, folder) / name).is_file() for repo in record.repos for name in repo.sha256
    )
    return record if every_file else None


def snapshot_dir(repo: PulledRepo, directory: Path | None = None) -> Path:
    """The folder holding ``repo``'s pulled files (``huggingface_hub``'s cache layout)."""
    folder = directory or models_dir()
    return folder / f"models--{repo.repo.replace('/', '--')}" / "snapshots" / repo.commit


def require_pulled(profile: str, directory: Path | None = None) -> PullRecord:
    """``profile``'s pull record; :class:`ModelMissing` naming the pull command when it was never pulled."""
    record = pulled(profile, directory)
    if record is None:
        raise ModelMissing(
            f"the verifier {profile!r} is not on this machine (looked in {directory or models_dir()}): "
            f"run `{pull_command(profile)}` once (it downloads the pinned checkpoint; afterwards no network is used)"
        )
    return record


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def pull(profile: str, model: VerifierModel, directory: Path | None = None) -> PullRecord:
    """Download ``model``'s files at their revisions into the models folder, check each weight file
    against the sha256 the hub lists, and write the pull record. Raises :class:`PullError`."""
    import httpx2  # huggingface_hub's HTTP client: a refused connection is its error, not the hub's
    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    from rt4chart.scrubbing import redact_url

    folder = directory or models_dir()
    api = HfApi()
    pulled_repos = []
    try:
        for source in model.sources():
            info = api.model_info(source.repo, revision=source.revision, files_metadata=True)
            listed = {sibling.rfilename: sibling for sibling in info.siblings or []}
            weights = [] if source is model.tokenizer else [next((w for w in WEIGHT_FILES if w in listed), None)]
            if None in weights:
                raise PullError(f"{source.repo}@{source.revision} holds none of {', '.join(WEIGHT_FILES)}")
            names = [name for name in (*TOKENIZER_FILES, *weights) if name in listed]
            if info.sha is None:
                raise PullError(f"the hub gave no commit for {source.repo}@{source.revision}")
            hashes = {}
            for name in names:
                path = Path(hf_hub_download(source.repo, name, revision=info.sha, cache_dir=folder))
                hashes[name] = _sha256(path)
                lfs = listed[name].lfs
                listed_hash = lfs.sha256 if lfs is not None else None
                if listed_hash is not None and listed_hash != hashes[name]:
                    path.unlink()
                    raise PullError(f"{source.repo}/{name}: sha256 {hashes[name]} differs from the hub's {listed_hash}")
            pulled_repos.append(PulledRepo(repo=source.repo, revision=source.revision, commit=info.sha, sha256=hashes))
    except (HfHubHTTPError, OfflineModeIsEnabled, httpx2.HTTPError, OSError) as error:
        raise PullError(f"cannot pull {profile!r} from {redact_url(constants.ENDPOINT)} (HF_ENDPOINT): "
                        f"{error}") from error
    record = PullRecord(profile=profile, repos=pulled_repos)
    path = _record_path(profile, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.model_dump_json(indent=2), encoding="utf-8")
    return record
