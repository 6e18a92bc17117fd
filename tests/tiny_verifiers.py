"""Tiny, randomly initialised checkpoints of the hub verifiers' classes, built from configs (no download).

Each is saved as the real repository is laid out (config, tokenizer files, ``model.safetensors``) in a
``huggingface_hub`` cache snapshot, with a pull record, so the backend loads it exactly as it loads a
pulled checkpoint. The Flan-T5 vocabulary puts ``▁`` at id 3 and ``▁1`` at id 209, where MiniCheck
reads them in the real one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    DebertaV2Config,
    DebertaV2ForSequenceClassification,
    DebertaV2Tokenizer,
    RobertaConfig,
    RobertaForSequenceClassification,
    RobertaTokenizer,
    T5Config,
    T5ForConditionalGeneration,
    T5ForTokenClassification,
    T5Tokenizer,
)

from rt4chart.judges.hub import PulledRepo, PullRecord, snapshot_dir

CORPUS = " ".join([
    "The Eiffel Tower is in Paris and it was finished in 1889 . The tower is 330 metres tall .",
    "Paris is the capital of France . The river Seine runs through the city . Prices rose by 12 percent",
    "in March while wages fell . The company was founded by Marie Curie in Warsaw .",
]).split()
"""Words the tiny tokenizers know (anything else falls back to characters or unknown)."""

COMMIT = "0123456789abcdef0123456789abcdef01234567"
"""The commit every tiny snapshot is stored under."""


def _unigram_vocab(labels_at: dict[int, str] | None = None) -> list[tuple[str, float]]:
    """A sentencepiece-style vocabulary: specials, ``▁``, the corpus words and single characters,
    with ``labels_at`` pieces placed at exactly those ids."""
    pieces = ["<pad>", "</s>", "<unk>"]
    words = sorted({f"▁{word}" for word in CORPUS} | {f"▁{digit}" for digit in "0123456789"})
    characters = sorted({char for word in CORPUS for char in word} | set("abcdefghijklmnopqrstuvwxyz:?.,"))
    ordered = [piece for piece in ["▁", *words, *characters] if piece not in (labels_at or {}).values()]
    for position, piece in sorted((labels_at or {}).items()):
        while len(pieces) < position:
            pieces.append(ordered.pop(0) if ordered else f"▁filler{len(pieces)}")
        pieces.append(piece)
    pieces.extend(ordered)
    return [(piece, 0.0 if index < 3 else -float(index) / 10) for index, piece in enumerate(pieces)]


def roberta_tokenizer(folder: Path) -> RobertaTokenizer:
    """A byte-level BPE tokenizer of RoBERTa's class trained on :data:`CORPUS`."""
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([" ".join(CORPUS)] * 3, vocab_size=400,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = trainer.save_model(str(folder))
    return RobertaTokenizer(vocab=vocab, merges=merges)


def t5_tokenizer() -> T5Tokenizer:
    """A T5 (Flan-T5) tokenizer with ``▁`` at id 3 and ``▁1`` at id 209, as in the real vocabulary."""
    return T5Tokenizer(vocab=_unigram_vocab({3: "▁", 209: "▁1"}), extra_ids=0)


def _store(directory: Path, repo: str, files: dict[str, bytes] | None = None, **saved: Any) -> PulledRepo:
    """Save the objects of ``saved`` (each with ``save_pretrained``) and the raw ``files`` into ``repo``'s
    snapshot, and return its pulled-repo entry with every file's sha256."""
    entry = PulledRepo(repo=repo, revision="main", commit=COMMIT, sha256={})
    folder = snapshot_dir(entry, directory)
    folder.mkdir(parents=True, exist_ok=True)
    for thing in saved.values():
        thing.save_pretrained(folder)
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    hashes = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.iterdir() if path.is_file()}
    return entry.model_copy(update={"sha256": hashes})


def write_record(directory: Path, profile: str, repos: list[PulledRepo]) -> PullRecord:
    """The pull record ``rt4 models pull`` would have written for these snapshots."""
    record = PullRecord(profile=profile, repos=repos)
    path = directory / "pulled" / f"{profile}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.model_dump_json(), encoding="utf-8")
    return record


def tiny_roberta(directory: Path, profile: str, max_positions: int = 64) -> PullRecord:
    """MiniCheck-RoBERTa-Large's classes at toy size (``max_positions`` tokens)."""
    torch.manual_seed(0)
    tokenizer = roberta_tokenizer(directory / "bpe")
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=max_positions + 2, num_labels=2,
                           pad_token_id=tokenizer.pad_token_id)
    model = RobertaForSequenceClassification(config)
    return write_record(directory, profile, [_store(directory, "lytang/MiniCheck-RoBERTa-Large",
                                                    model=model, tokenizer=tokenizer)])


def tiny_deberta(directory: Path, profile: str) -> PullRecord:
    """MiniCheck-DeBERTa-v3-Large's classes at toy size."""
    torch.manual_seed(0)
    tokenizer = DebertaV2Tokenizer(vocab=[("[PAD]", 0.0), ("[UNK]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0),
                                          ("[MASK]", 0.0), *_unigram_vocab()[3:]])
    config = DebertaV2Config(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=128, num_labels=2, pad_token_id=0)
    model = DebertaV2ForSequenceClassification(config)
    return write_record(directory, profile, [_store(directory, "lytang/MiniCheck-DeBERTa-v3-Large",
                                                    model=model, tokenizer=tokenizer)])


def _t5_config(tokenizer: T5Tokenizer) -> T5Config:
    return T5Config(vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, feed_forward_proj="gated-gelu",
                    tie_word_embeddings=False)


def tiny_flan_t5(directory: Path, profile: str) -> PullRecord:
    """MiniCheck-Flan-T5-Large's classes at toy size."""
    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    model = T5ForConditionalGeneration(_t5_config(tokenizer))
    return write_record(directory, profile, [_store(directory, "lytang/MiniCheck-Flan-T5-Large",
                                                    model=model, tokenizer=tokenizer)])


HHEM_CONFIG = {
    "architectures": ["HHEMv2ForSequenceClassification"],
    "auto_map": {"AutoConfig": "configuration_hhem_v2.HHEMv2Config",
                 "AutoModelForSequenceClassification": "modeling_hhem_v2.HHEMv2ForSequenceClassification"},
    "model_type": "HHEMv2Config",
    "foundation": "google/flan-t5-base",
}
"""The shape of HHEM-2.1-open's ``config.json``: remote code, and the foundation it is built on."""


def tiny_hhem(directory: Path, profile: str) -> tuple[PullRecord, T5ForTokenClassification]:
    """HHEM-2.1-open as published: its ``T5ForTokenClassification`` saved under the attribute ``t5``
    (the weights repository holds no tokenizer), and its foundation's config and tokenizer in a second
    repository. Returns the record and the head, for reference scores."""
    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    config = _t5_config(tokenizer)
    config.num_labels = 2
    head = T5ForTokenClassification(config).eval()
    state = {f"t5.{name}": tensor.contiguous() for name, tensor in head.state_dict().items()
             if name != "transformer.encoder.embed_tokens.weight"}  # tied to the shared embedding
    weights_path = directory / "hhem.safetensors"
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, weights_path)
    weights = _store(directory, "vectara/hallucination_evaluation_model", files={
        "model.safetensors": weights_path.read_bytes(), "config.json": json.dumps(HHEM_CONFIG).encode()})
    foundation = _store(directory, "google/flan-t5-base", config=config, tokenizer=tokenizer)
    return write_record(directory, profile, [weights, foundation]), head


def tiny_lettucedetect(directory: Path, profile: str) -> PullRecord:
    """LettuceDetect's classes at toy size: a ``ModernBertForTokenClassification`` and a fast tokenizer
    that encodes a pair as ``[CLS] prompt [SEP] answer [SEP]`` with character offsets, as ModernBERT's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import ModernBertConfig, ModernBertForTokenClassification, PreTrainedTokenizerFast

    torch.manual_seed(0)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = sorted({word for word in CORPUS} | set("abcdefghijklmnopqrstuvwxyz0123456789:?.,"))
    vocab = {token: index for index, token in enumerate([*specials, *words])}
    backbone = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backbone.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backbone.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backbone, unk_token="[UNK]", pad_token="[PAD]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    config = ModernBertConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, max_position_embeddings=512, num_labels=2,
                              pad_token_id=vocab["[PAD]"], cls_token_id=vocab["[CLS]"], sep_token_id=vocab["[SEP]"],
                              bos_token_id=vocab["[CLS]"], eos_token_id=vocab["[SEP]"])
    model = ModernBertForTokenClassification(config)
    return write_record(directory, profile, [_store(directory, "KRLabsOrg/lettucedect-base-modernbert-en-v1",
                                                    model=model, tokenizer=tokenizer)])
