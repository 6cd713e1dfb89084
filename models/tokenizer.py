"""The tokenizer a GGUF file declares (tokenizer.ggml.*), giving the same token ids as llama.cpp.

The Rust `tokenizers` library does the work, configured the way llama.cpp (src/llama-vocab.cpp) behaves:
- "gpt2": byte-level BPE with the file's merges, words split by the regexes of tokenizer.ggml.pre.
- "llama": SentencePiece-style BPE. llama.cpp merges the adjacent pair whose concatenation is the vocab
  token with the highest score, so the merge list is every split of a token into two vocab tokens,
  best score first; characters outside the vocab fall back to <0xXX> byte tokens.
- "gemma4": BPE with the file's merges over the raw UTF-8 text, spaces written as ▁ (no prefix), split only at
  newlines; a run of newlines is its one token where the vocab has it (such tokens are split out first; a longer
  run is merged as any text is); <0xXX> byte tokens for what is outside the vocab; BOS always added (llama.cpp's
  override for Gemma 4).
Control, unknown and user-defined tokens are split out of the text first, as llama.cpp does (control and
unknown ones only with parse_special).
"""
import codecs
import re
import threading

import numpy as np
from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from models.errors import UserError
from models.pretokenizers import pre_tokenizer_for


class TokenizerError(UserError, ValueError):
    pass


# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama.cpp marks these texts as control and as end of generation, whatever the file says
EOG_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
}
# fill-in-the-middle pad/repo/file-separator tokens: llama.cpp ends generation on the first one found of each
FIM_EOG_TEXTS = (
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)
SPM_SPACE = "\u2581"  # ▁, how SentencePiece writes a space
# gpt-oss's message markup: llama.cpp makes these user-defined tokens in any vocab (llama-vocab.cpp), so that a
# reply shows its channel headers (and user text that spells one is that token)
HARMONY_MARKUP = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the byte-level BPE alphabet)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    stand_in = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in stand_in:
            stand_in[b] = chr(256 + extra)
            extra += 1
    return stand_in


BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


def _bpe_piece(text: str) -> bytes:
    """Bytes of a byte-level BPE token; a char outside the alphabet is shown the way llama.cpp shows it."""
    out = bytearray()
    for c in text:
        if c in BYTE_OF_CHAR:
            out.append(BYTE_OF_CHAR[c])
        else:
            out += b"[UNK_BYTE_0x" + c.encode().hex().encode() + text.encode() + b"]"
    return bytes(out)


def _string_hashes(tokens: list[str]):
    """64-bit polynomial hashes of every substring start..end of the concatenated tokens.

    Returns (starts, lengths, hash(start, end)) so splits can be looked up without making a Python string each.
    """
    lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    starts = np.zeros(len(tokens) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    chars = np.frombuffer("".join(tokens).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64) + 1
    base, base_inv = np.uint64(0x100000001B3), np.uint64(pow(0x100000001B3, -1, 1 << 64))
    powers = np.ones(len(chars) + 1, dtype=np.uint64)
    inverse = np.ones(len(chars) + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        powers[1:] = base
        inverse[1:] = base_inv
        powers = np.cumprod(powers)  # base**i mod 2**64
        inverse = np.cumprod(inverse)
        prefix = np.zeros(len(chars) + 1, dtype=np.uint64)
        np.cumsum(chars * powers[:-1], out=prefix[1:])

    def substring_hash(start, end):
        with np.errstate(over="ignore"):
            return (prefix[end] - prefix[start]) * inverse[start] + (end - start).astype(np.uint64) * np.uint64(31)

    return starts, lengths, substring_hash


def spm_merges(tokens: list[str], scores: np.ndarray) -> list[tuple[str, str]]:
    """Every split of a vocab token into two vocab tokens, highest token score first (llama.cpp's SPM order).

    Vectorised with 64-bit substring hashes: a Python loop over the ~1.8M splits of a 262k vocab takes
    seconds. A false hit needs a 64-bit collision (odds ~1e-8 for Gemma's vocab, or a vocab crafted for it,
    which can only spoil its own tokenization); mostly it names a pair that is no token and the build
    fails with a TokenizerError.
    """
    starts, lengths, substring_hash = _string_hashes(tokens)
    token_hash = substring_hash(starts[:-1], starts[:-1] + lengths)
    order = np.argsort(token_hash, kind="stable")
    sorted_hash = token_hash[order]

    def lookup(hashes):  # token id per hash, -1 where no token has it
        pos = np.minimum(np.searchsorted(sorted_hash, hashes), len(sorted_hash) - 1)
        return np.where(sorted_hash[pos] == hashes, order[pos], -1)

    n_splits = np.maximum(lengths - 1, 0)
    token = np.repeat(np.arange(len(tokens)), n_splits)  # (S,) which token each split cuts
    first = np.repeat(starts[:-1], n_splits)
    cut = first + 1 + (np.arange(len(token)) - np.repeat(np.cumsum(n_splits) - n_splits, n_splits))
    left = lookup(substring_hash(first, cut))
    hit = left >= 0  # look up right halves only where the left half is a token
    token, left, first, cut = token[hit], left[hit], first[hit], cut[hit]
    right = lookup(substring_hash(cut, first + lengths[token]))
    hit = right >= 0
    token, left, right = token[hit], left[hit], right[hit]
    rank = np.lexsort((left, token, -scores[token]))  # best score first; ties by token id, then left part
    texts = np.array(tokens, dtype=object)
    return list(zip(texts[left[rank]].tolist(), texts[right[rank]].tolist()))


def _bpe_merges(merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """tokenizer.ggml.merges "left right" lines (split at the first space after the first char, as llama.cpp)."""
    pairs = []
    for line in merges:
        cut = line.find(" ", 1)
        if cut < 0:
            continue
        left, right = line[:cut], line[cut + 1:]
        if left in vocab and right in vocab and left + right in vocab:  # tokenizers needs all three
            pairs.append((left, right))
    return pairs


class Tokenizer:
    """encode/decode exactly like llama.cpp for the vocab a GGUF file carries."""

    def __init__(self, metadata: dict):
        kind = metadata.get("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama", "gemma4"):
            raise TokenizerError(f"unsupported tokenizer model '{kind}' (tokenizer.ggml.model); "
                                 "supported: gpt2 (byte-level BPE), llama (SentencePiece), gemma4 (BPE on ▁ text)")
        self.kind = kind
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError("tokenizer.ggml.tokens is missing or not a list of strings")
        if not all(tokens):  # llama.cpp names empty tokens so that each text stays unique
            tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.tokens = tokens
        self.types = self._per_token_array(metadata, "tokenizer.ggml.token_type", np.int32, NORMAL)
        self.scores = self._per_token_array(metadata, "tokenizer.ggml.scores", np.float32, 0.0)
        vocab = dict(zip(tokens, range(len(tokens))))
        if len(vocab) != len(tokens):
            raise TokenizerError("tokenizer.ggml.tokens holds the same token text twice")
        self.vocab = vocab

        if kind == "gpt2":  # llama.cpp's defaults for keys the file leaves out
            self.pre = pre_tokenizer_for(metadata.get("tokenizer.ggml.pre"))
            bos, eos, add_space_prefix, add_bos = 11, 11, False, self.pre.add_bos
            self.clean_spaces = self.pre.clean_spaces
        elif kind == "gemma4":  # no default ids: the file's
            self.pre = None
            bos, eos, add_space_prefix, add_bos = None, None, False, True
            self.clean_spaces = True
        else:
            self.pre = None
            bos, eos, add_space_prefix, add_bos = 1, 2, True, True
            self.clean_spaces = False
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", add_space_prefix))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos)) or kind == "gemma4"
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        self.bos_id = self._special_id(metadata, "bos", bos)
        self.eos_id = self._special_id(metadata, "eos", eos)
        self.eot_id = self._special_id(metadata, "eot", None)
        self.eom_id = self._special_id(metadata, "eom", None)
        if self.add_bos and self.bos_id is None:
            raise TokenizerError("the file asks for a BOS token but declares no valid tokenizer.ggml.bos_token_id")
        if self.add_eos and self.eos_id is None:
            raise TokenizerError("the file asks for an EOS token but declares no valid tokenizer.ggml.eos_token_id")

        self.control = (self.types == CONTROL) | (self.types == UNKNOWN)  # hidden unless decoding special
        for text in HARMONY_MARKUP:
            if text in self.vocab:
                self._user_defined(self.vocab[text])
        self._mark_end_of_generation()
        self._check_byte_tokens()
        # A byte the vocab lacks stays a symbol in llama.cpp's BPE, blocking merges across it, and is dropped at
        # the end; tokenizers would drop it first. Stand-in ids past the vocab keep it until encode drops them.
        self._missing_bytes = [c for c in BYTE_OF_CHAR if c not in vocab] if kind == "gpt2" else []
        self._metadata = metadata
        try:
            self._rust = self._build(metadata)
        except BaseException as e:  # tokenizers reports some bad input as a Rust panic, a BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise TokenizerError(f"cannot build the tokenizer from this file: {e}") from None
        self._encode_lock = threading.Lock()  # encode_special_tokens is state on the shared Rust object
        # gemma4: runs of newlines longer than the vocab's longest, which llama.cpp merges as any text
        longest = max((len(t) for t in self.tokens if t and not t.strip("\n")), default=0) if kind == "gemma4" else 0
        self._long_newlines = re.compile(f"(\n{{{longest + 1},}})") if longest else None
        self._merges_only = None  # the tokenizer without the newline runs split out first, made when one comes
        self._no_space_prefix = None  # the tokenizer of encode_continuation where add_space_prefix, made when asked
        self._pieces: dict[tuple[int, bool], bytes] = {}

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def _per_token_array(self, metadata, key, dtype, default):
        values = metadata.get(key)
        if values is None:
            return np.full(len(self.tokens), default, dtype=dtype)
        values = np.asarray(values)
        if values.ndim != 1 or len(values) < len(self.tokens) or not np.issubdtype(values.dtype, np.number):
            raise TokenizerError(f"{key} must be a numeric array at least as long as tokenizer.ggml.tokens")
        return values[:len(self.tokens)].astype(dtype)

    def _special_id(self, metadata, name: str, default: int | None) -> int | None:
        """An id from tokenizer.ggml.<name>_token_id; out of range means llama.cpp's default (or none)."""
        value = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(value, (int, np.integer)) and 0 <= value < len(self.tokens):
            return int(value)
        return default if default is not None and default < len(self.tokens) else None

    def _mark_end_of_generation(self):
        """Sets eog_ids, every id llama.cpp stops on, and marks those it knows by text as control, as it does."""
        eog = set()
        for texts in FIM_EOG_TEXTS:
            found = [self.vocab[t] for t in texts if t in self.vocab]
            if found:
                eog.add(found[0])
                self.control[found[0]] = True
        for text in EOG_TEXTS & self.vocab.keys():
            eog.add(self.vocab[text])
            self.control[self.vocab[text]] = True
        eog |= {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
        texts = {self.tokens[i] for i in eog}
        if {"<|return|>", "<|call|>", "<|end|>"} <= texts or {"<|calls|>", "<|flush|>", "<|end|>"} <= texts:
            eog.discard(self.vocab["<|end|>"])  # gpt-oss / solar-open: <|end|> ends a message, not the reply,
            self._user_defined(self.vocab["<|end|>"])  # which shows it (its parser splits the messages there)
        if "</s>" in texts and texts & {"<|tool_response>", "<|plamo:eos|>"}:
            eog.discard(self.vocab["</s>"])
        self.eog_ids = frozenset(eog)

    def _user_defined(self, i: int) -> None:
        """Token i shown in any text and matched in any text, as llama.cpp makes some control tokens."""
        self.types[i], self.control[i] = USER_DEFINED, False

    def _check_byte_tokens(self):
        for i in np.flatnonzero(self.types == BYTE):
            text = self.tokens[i]
            if len(text) != 6 or not text.startswith("<0x") or text[-1] != ">" or \
                    not all(c in "0123456789abcdefABCDEF" for c in text[3:5]):
                raise TokenizerError(f"byte token {i} is '{text}', expected <0xXX>")

    def _build(self, metadata, newline_tokens: bool = True, space_prefix: bool = True) -> RustTokenizer:
        merges = metadata.get("tokenizer.ggml.merges")
        if self.kind in ("gpt2", "gemma4") and (not isinstance(merges, list)
                                                or not all(isinstance(m, str) for m in merges)):
            raise TokenizerError(f"tokenizer.ggml.merges is missing or not a list of strings ({self.kind} needs it)")
        newlines = []  # gemma4: runs of newlines the vocab has, split out whole
        if self.kind == "gpt2":
            vocab = {**self.vocab, **{c: len(self.tokens) + k for k, c in enumerate(self._missing_bytes)}}
            model = models.BPE(vocab, _bpe_merges(merges, self.vocab), ignore_merges=self.pre.ignore_merges)
            rust = RustTokenizer(model)
            rust.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self.pre.regexes]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif self.kind == "gemma4":
            rust = RustTokenizer(models.BPE(self.vocab, _bpe_merges(merges, self.vocab), byte_fallback=True))
            rust.normalizer = normalizers.Replace(" ", SPM_SPACE)
            rust.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
            newlines = [i for t, i in self.vocab.items() if t and not t.strip("\n")] if newline_tokens else []
        else:
            rust = RustTokenizer(models.BPE(self.vocab, spm_merges(self.tokens, self.scores), byte_fallback=True))
            steps = [normalizers.Replace(" ", SPM_SPACE)]
            if self.add_space_prefix and space_prefix:  # llama.cpp adds it to every text after a special token
                steps.insert(0, normalizers.Prepend(SPM_SPACE))
            rust.normalizer = normalizers.Sequence(steps)
        special = self.control | (self.types == USER_DEFINED)
        rust.add_tokens([AddedToken(self.tokens[i], special=bool(self.control[i]), normalized=False)
                         for i in sorted({*np.flatnonzero(special), *newlines})])
        return rust

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text. add_special: the BOS/EOS the file asks for. parse_special: control-token texts
        such as <|im_end|> in the text become those tokens (for rendered chat prompts, never for user text)."""
        with self._encode_lock:
            self._rust.encode_special_tokens = not parse_special
            if self._long_newlines is not None and self._long_newlines.search(text):
                ids = self._encode_long_newlines(text)
            else:
                ids = self._rust.encode(text, add_special_tokens=False).ids
        if self._missing_bytes:
            ids = [i for i in ids if i < len(self.tokens)]
        if add_special and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of text as the continuation of a text before it: no BOS, control-token texts as text, and no space
        prefix (an SPM vocabulary's "▁" before a text of its own). A grammar engine tokenizes the bytes its grammar
        forces with this: with the prefix, '{' became the bytes of " {" and the first of them was allowed."""
        if not self.add_space_prefix:
            return self.encode(text, add_special=False)
        with self._encode_lock:
            if self._no_space_prefix is None:
                self._no_space_prefix = self._build(self._metadata, space_prefix=False)
            self._no_space_prefix.encode_special_tokens = True
            return self._no_space_prefix.encode(text, add_special_tokens=False).ids

    def _encode_long_newlines(self, text: str) -> list[int]:
        """gemma4's ids of a text with runs of newlines longer than any newline token: the runs merged as llama.cpp
        merges them (its pre-split makes each run a word of its own), the rest as encode does."""
        if self._merges_only is None:
            self._merges_only = self._build(self._metadata, newline_tokens=False)
        ids = []
        for k, piece in enumerate(self._long_newlines.split(text)):  # the runs at odd places
            if piece:
                ids += (self._merges_only if k % 2 else self._rust).encode(piece, add_special_tokens=False).ids
        return ids

    def encode_prompt(self, prompt: str) -> list[int]:
        """Ids of a rendered chat prompt: its control tokens parsed, BOS once even when the template wrote
        it too (llama.cpp strips the template's BOS text when the vocab adds one)."""
        if self.add_bos and prompt.startswith(self.tokens[self.bos_id]):
            prompt = prompt[len(self.tokens[self.bos_id]):]
        return self.encode(prompt, add_special=True, parse_special=True)

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes one token stands for (llama_token_to_piece); control tokens are empty unless special."""
        key = (token_id, special)
        if key not in self._pieces:
            if not 0 <= token_id < len(self.tokens):
                raise TokenizerError(f"token id {token_id} is outside the vocabulary (size {len(self.tokens)})")
            self._pieces[key] = self._piece(token_id, special)
        return self._pieces[key]

    def _piece(self, i: int, special: bool) -> bytes:
        text, kind = self.tokens[i], self.types[i]
        if self.control[i]:
            return text.encode() if special else b""
        if kind == USER_DEFINED:
            return text.encode()
        if kind == NORMAL:
            return text.replace(SPM_SPACE, " ").encode() if self.kind != "gpt2" else _bpe_piece(text)
        if kind == BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def decode_bytes(self, ids: list[int], special: bool = False) -> bytes:
        """llama_detokenize(remove_special=False): pieces joined, the space llama.cpp prefixed removed."""
        out = b"".join(self.token_to_piece(i, special) for i in ids)
        if self.add_space_prefix and ids and self.token_to_piece(ids[0], special).startswith(b" "):
            out = out[1:]
        return _clean_spaces(out) if self.clean_spaces else out

    def decode(self, ids: list[int], special: bool = False) -> str:
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def stream(self, special: bool = False, at_start: bool = True, shown=()) -> "StreamDecoder":
        """at_start=False: the tokens continue a text (a reply after its prompt), so no leading space is dropped.
        shown: texts of control tokens that come as their text even without special (llama-server's preserved
        tokens, such as Gemma 4's channel markers)."""
        return StreamDecoder(self, special, at_start, shown)


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: no space before ?!., or 's 'm 're 've, none around a lone '."""
    for before in b"?!.,":
        text = text.replace(b" " + bytes([before]), bytes([before]))
    text = text.replace(b" ' ", b"'")
    for suffix in (b"'s", b"'m", b"'re", b"'ve"):
        text = text.replace(b" " + suffix, suffix)
    return text


class StreamDecoder:
    """Turns generated token ids into text as they come, never splitting a UTF-8 character.

    Joined output equals Tokenizer.decode of the same ids (the space llama.cpp prefixes to SentencePiece text
    is dropped from the first token when the ids start a text) for tokenizers without clean_spaces; with it,
    spaces stay as generated.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False, at_start: bool = True, shown=()):
        self._tokenizer = tokenizer
        self._special = special
        self._shown = {tokenizer.vocab[t] for t in shown if t in tokenizer.vocab}
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = at_start

    def push(self, token_id: int) -> str:
        piece = self._tokenizer.token_to_piece(token_id, self._special or token_id in self._shown)
        if self._first and self._tokenizer.add_space_prefix and piece.startswith(b" "):
            piece = piece[1:]
        self._first = False
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """What is left at the end: an unfinished UTF-8 sequence comes out as U+FFFD."""
        return self._utf8.decode(b"", final=True)
