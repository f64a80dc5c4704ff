"""A tiny byte-level BPE tokenizer.json (GPT-2's pre-tokenizer and decoder, merges trained by
`tokenizers` on tiny_bert's sentences, so the same every run): BERT-style special tokens added
after the merges' vocabulary and a `[CLS] $A [SEP]` template, as ModernBERT's tokenizer has them,
or RoBERTa's (<s> </s> first, RobertaProcessing), as jina-embeddings-v2-base-es/de's."""

from __future__ import annotations

import json
from typing import Any

from tiny_bert import SENTENCES, WORDS

SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")
ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
N_MERGED = 400  # the byte alphabet (256) and the merges the trainer finds up to this size


def bpe_tokenizer(roberta: bool = False, extra: tuple[str, ...] = ("[unused0]", "[unused1]")) -> dict[str, Any]:
    """tokenizer.json's content: ByteLevel BPE; the special tokens (roberta: RoBERTa's, ids 0-4),
    then `extra` added tokens that are not special; `[CLS] $A [SEP]` added by a TemplateProcessing
    post-processor (roberta: `<s> $A </s>` by a RobertaProcessing one)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials, cls, sep = (ROBERTA_SPECIALS, "<s>", "</s>") if roberta else (SPECIALS, "[CLS]", "[SEP]")
    trainer = trainers.BpeTrainer(vocab_size=N_MERGED, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=list(specials) if roberta else [])
    tok.train_from_iterator(list(SENTENCES) * 3 + [" ".join(WORDS)] * 3, trainer)
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True, lstrip=s in ("[MASK]", "<mask>"))
                            for s in specials])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in extra])
    ids = {s: tok.token_to_id(s) for s in (cls, sep)}
    if roberta:
        tok.post_processor = processors.RobertaProcessing((sep, ids[sep]), (cls, ids[cls]),
                                                          add_prefix_space=False)
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, ids[cls]), (sep, ids[sep])])
    out: dict[str, Any] = json.loads(tok.to_str())
    return out


def special_id(tok: dict[str, Any], content: str) -> int:
    return next(int(a["id"]) for a in tok["added_tokens"] if a["content"] == content)
