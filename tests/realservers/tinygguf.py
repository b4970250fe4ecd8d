"""A tiny random-weight llama-architecture GGUF with a real byte-level BPE vocabulary, made offline.

The real llama.cpp servers (tests/realservers/conftest.py) serve it: what they answer is nonsense text,
but every token, logprob, offset, stop and tokenization goes through llama.cpp's own code. The vocabulary
is trained here (the `tokenizers` package) on the text below, small enough that many characters outside
ASCII stay split into byte tokens, the partial UTF-8 pieces that break naive offset and top-k handling.

    python -m tests.realservers.tinygguf OUT.gguf
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS = "<s>", "</s>"
VOCAB = 512
EMBD, LAYERS, HEADS, FF, CONTEXT = 64, 2, 4, 128, 2048
SEED = 1234

CORPUS = """\
# hello world — unicode ✓
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.
Question: What is 2 + 2? Answer: 4.
Question: What is the capital of France? Answer: Paris.
def add(a, b):
    return a + b

class Counter:
    def __init__(self):
        self.count = 0
# héllo wörld — ünïcode ✓ café naïve résumé
Once upon a time there was a little model that could only say random things.
It said them anyway, with great confidence, one token at a time.
"""


def train_vocab() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True) * 4, trainer=trainer)
    return tok


def write(path: Path) -> None:
    tok = train_vocab()
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    n_vocab = len(tokens)
    types = [gguf.TokenType.CONTROL if t in (BOS, EOS) else gguf.TokenType.NORMAL for t in tokens]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(EMBD)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(EMBD // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[BOS])
    w.add_eos_token_id(vocab[EOS])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    rng = np.random.default_rng(SEED)

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    # numpy shape (rows, cols) is GGUF's {cols, rows}: llama.cpp's {n_embd, n_vocab} is (n_vocab, n_embd).
    w.add_tensor("token_embd.weight", weight(n_vocab, EMBD, scale=1.0))
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", weight(EMBD, EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(FF, EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(FF, EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(EMBD, FF))
    w.add_tensor("output_norm.weight", np.ones(EMBD, dtype=np.float32))
    # Peaked enough that greedy decoding is stable and the top alternatives are distinct.
    w.add_tensor("output.weight", weight(n_vocab, EMBD, scale=0.5))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write(Path(sys.argv[1]))
