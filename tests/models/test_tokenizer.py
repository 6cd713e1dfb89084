"""The tokenizer against llama.cpp (llama-cpp-python, vocab only) on both packaged models and on
vocab-only GGUF files that give the SmolLM2 vocab other pre-tokenizers (and Gemma's a space prefix)."""
import ctypes
import time

import llama_cpp
import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter

from models.gguf import open_gguf
from models.pretokenizers import UnknownPreTokenizer
from models.tokenizer import Tokenizer, TokenizerError
from tests.models.tokenizer_corpus import CORPUS, random_strings

FLAGS = [(add, parse) for add in (True, False) for parse in (True, False)]


class Oracle:
    """llama.cpp's vocab for one file."""

    def __init__(self, path):
        self.llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = self.llama._model.vocab

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.llama.tokenize(text.encode(), add_bos=add_special, special=parse_special)

    def piece(self, token_id: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(1024)
        n = llama_cpp.llama_token_to_piece(self.vocab, token_id, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, ids: list[int], special: bool) -> bytes:
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        buf = ctypes.create_string_buffer(64 * len(ids) + 64)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, len(buf), False, special)
        assert n >= 0
        return buf.raw[:n]

    def is_eog(self, token_id: int) -> bool:
        return llama_cpp.llama_vocab_is_eog(self.vocab, token_id)


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    path = request.getfixturevalue(request.param)
    return Tokenizer(open_gguf(path).metadata), Oracle(path)


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma3):
    return Tokenizer(open_gguf(gemma3).metadata)


def mismatches(tok, oracle, texts, flags=FLAGS):
    return [(text, add, parse, tok.encode(text, add, parse), oracle.tokenize(text, add, parse))
            for text in texts for add, parse in flags
            if tok.encode(text, add, parse) != oracle.tokenize(text, add, parse)]


def test_corpus_is_broad():
    assert len(CORPUS) >= 200
    assert "" in CORPUS and any("\u200d" in s for s in CORPUS) and any("\r\n" in s for s in CORPUS)


def test_token_ids_equal_llama_cpp(model):
    tok, oracle = model
    assert mismatches(tok, oracle, CORPUS) == []


def test_random_strings_equal_llama_cpp(model):
    tok, oracle = model
    assert mismatches(tok, oracle, random_strings(seed=0, n=1000), flags=[(True, True), (False, False)]) == []


def test_control_tokens_only_with_parse_special(model):
    tok, oracle = model
    end = "<|im_end|>" if "<|im_end|>" in tok.vocab else "<end_of_turn>"
    assert tok.encode(end, add_special=False, parse_special=True) == [tok.vocab[end]]
    assert len(tok.encode(end, add_special=False, parse_special=False)) > 1


def test_chat_prompt_gets_one_bos(gemma_tokenizer):
    tok = gemma_tokenizer
    turn = "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert tok.encode_prompt("<bos>" + turn) == tok.encode_prompt(turn) == tok.encode(turn, True, True)
    assert tok.encode_prompt(turn)[:2] == [tok.bos_id, tok.vocab["<start_of_turn>"]]


def test_every_piece_equals_llama_cpp(model):
    tok, oracle = model
    for special in (False, True):
        bad = [i for i in range(tok.vocab_size) if tok.token_to_piece(i, special) != oracle.piece(i, special)]
        assert bad == []


def test_decode_equals_llama_detokenize(model):
    tok, oracle = model
    for text in CORPUS:
        ids = oracle.tokenize(text, True, True)
        for special in (False, True):
            assert tok.decode_bytes(ids, special) == oracle.detokenize(ids, special), text


def test_round_trip_wherever_llama_cpp_round_trips(model):
    tok, oracle = model
    round_trips = 0
    for text in CORPUS:
        ids = tok.encode(text, add_special=False)
        if oracle.detokenize(oracle.tokenize(text, False, False), False) == text.encode():
            assert tok.decode(ids) == text
            round_trips += 1
    assert round_trips >= 0.9 * len(CORPUS)


def test_stream_decoder_never_splits_a_character(model):
    tok, _ = model
    for text in CORPUS:
        ids = tok.encode(text, add_special=False)
        stream = tok.stream()
        parts = [stream.push(i) for i in ids] + [stream.flush()]
        assert "".join(parts) == tok.decode(ids)
        assert all("\ufffd" not in p for p in parts) or "\ufffd" in text


def test_stream_decoder_holds_partial_utf8_bytes(gemma_tokenizer):
    tok = gemma_tokenizer
    byte_ids = [tok.vocab[f"<0x{b:02X}>"] for b in "🦙".encode()]  # four byte-fallback tokens
    stream = tok.stream()
    assert [stream.push(i) for i in byte_ids] == ["", "", "", "🦙"]
    stream.push(byte_ids[0])
    assert stream.flush() == "\ufffd"


def test_shown_control_tokens_come_as_their_text_as_llama_server_shows_preserved_ones(gemma3, gemma_tokenizer):
    """A chat format's preserved tokens (Gemma 4's channel markers; Gemma 3's <start_of_turn> here) are pieces with
    special, the other control tokens stay hidden."""
    tok, oracle = gemma_tokenizer, Oracle(gemma3)
    shown, hidden = tok.vocab["<start_of_turn>"], tok.vocab["<mask>"]
    ids = [shown, *tok.encode("model", add_special=False), hidden]
    stream = tok.stream(at_start=False, shown=("<start_of_turn>", "<not in the vocab>"))
    pieces = [stream.push(i).encode() for i in ids]
    assert pieces == [oracle.piece(shown, True), *(oracle.piece(i, False) for i in ids[1:])]
    assert pieces[0] == b"<start_of_turn>" and pieces[-1] == b""


def test_end_of_generation_ids_equal_llama_cpp(model):
    tok, oracle = model
    assert tok.eog_ids == {i for i in range(tok.vocab_size) if oracle.is_eog(i)}
    ends = {"<|im_end|>", "<|endoftext|>"} if "<|im_end|>" in tok.vocab else {"<eos>", "<end_of_turn>"}
    assert {tok.vocab[t] for t in ends} <= tok.eog_ids


def test_encodes_100kB_under_half_a_second(model):
    tok, _ = model
    text = ("\n".join(CORPUS) * 40).encode()[:100_000].decode(errors="ignore")
    tok.encode(text[:1000])
    start = time.process_time()  # CPU time: wall time also counts a shared machine's other processes (0.6 s once)
    tok.encode(text)
    assert time.process_time() - start < 0.5


ARRAY_TYPES = {np.dtype(np.int32): GGUFValueType.INT32, np.dtype(np.float32): GGUFValueType.FLOAT32}


def write_vocab_only(source, path, **overrides):
    """A GGUF file with source's metadata (overrides applied, None drops a key) and no tensors."""
    model = open_gguf(source)
    metadata = {**model.metadata, **{k.replace("__", "."): v for k, v in overrides.items()}}
    writer = GGUFWriter(path, metadata["general.architecture"])
    for key, value in metadata.items():
        if key == "general.architecture" or value is None:
            continue
        if isinstance(value, np.ndarray):
            writer.add_key_value(key, value.tolist(), GGUFValueType.ARRAY, sub_type=ARRAY_TYPES[value.dtype])
        elif isinstance(value, list):
            writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
        else:
            vtype = model.value_types.get(key, GGUFValueType.BOOL if isinstance(value, bool) else GGUFValueType.STRING)
            writer.add_key_value(key, value, GGUFValueType(vtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-v3", "deepseek-coder",
                                 "gpt-4o", "tekken", "gpt-2", "starcoder", "falcon", "bloom", "viking"])
def test_pre_tokenizers_equal_llama_cpp(smollm2, tmp_path, pre):
    path = write_vocab_only(smollm2, tmp_path / f"{pre}.gguf", tokenizer__ggml__pre=pre,
                            tokenizer__ggml__add_bos_token=None)
    tok, oracle = Tokenizer(open_gguf(path).metadata), Oracle(path)
    assert mismatches(tok, oracle, CORPUS + random_strings(seed=1, n=300), flags=[(True, False), (False, True)]) == []
    ids = [oracle.tokenize(text, True, True) for text in CORPUS]
    assert [tok.decode_bytes(i) for i in ids] == [oracle.detokenize(i, False) for i in ids]


def test_sentencepiece_space_prefix_equals_llama_cpp(gemma3, tmp_path):
    path = write_vocab_only(gemma3, tmp_path / "prefixed.gguf", tokenizer__ggml__add_space_prefix=True)
    tok, oracle = Tokenizer(open_gguf(path).metadata), Oracle(path)
    assert mismatches(tok, oracle, CORPUS) == []
    ids = [oracle.tokenize(text, True, True) for text in CORPUS]
    assert [tok.decode_bytes(i) for i in ids] == [oracle.detokenize(i, False) for i in ids]
    stream = tok.stream()
    assert "".join(stream.push(i) for i in tok.encode("Hello world", add_special=False)) == "Hello world"
    # tokens that continue a prompt ("The capital of France is" + " Paris") keep the space, as llama.cpp prints them
    continued = tok.encode(" Paris", add_special=False)
    assert "".join(tok.stream(at_start=False).push(i) for i in continued) == \
        b"".join(oracle.piece(i, False) for i in continued).decode()


def test_special_id_past_the_vocab_falls_back_like_llama_cpp(smollm2, tmp_path):
    path = write_vocab_only(smollm2, tmp_path / "bad_bos.gguf", tokenizer__ggml__bos_token_id=10**6,
                            tokenizer__ggml__add_bos_token=True)
    tok, oracle = Tokenizer(open_gguf(path).metadata), Oracle(path)
    assert tok.encode("Hi there") == oracle.tokenize("Hi there", True, False) == [11, 26843, 665]


def smollm_metadata(smollm2, **overrides):
    return {**open_gguf(smollm2).metadata, **{k.replace("__", "."): v for k, v in overrides.items()}}


@pytest.mark.parametrize("overrides, message", [
    ({"tokenizer__ggml__pre": "no-such-pre"}, "unknown pre-tokenizer 'no-such-pre'"),
    ({"tokenizer__ggml__model": "t5"}, "unsupported tokenizer model 't5'"),
    ({"tokenizer__ggml__tokens": None}, "tokenizer.ggml.tokens is missing"),
    ({"tokenizer__ggml__merges": None}, "tokenizer.ggml.merges is missing"),
    ({"tokenizer__ggml__merges": [1, 2]}, "not a list of strings"),
    ({"tokenizer__ggml__scores": ["x"] * 49152}, "tokenizer.ggml.scores must be"),
    ({"tokenizer__ggml__token_type": np.ones(5, dtype=np.int32)}, "tokenizer.ggml.token_type must be"),
])
def test_bad_tokenizer_metadata_is_a_clear_error(smollm2, overrides, message):
    with pytest.raises((TokenizerError, UnknownPreTokenizer), match=message.replace(".", r"\.")):
        Tokenizer({k: v for k, v in smollm_metadata(smollm2, **overrides).items() if v is not None})


def test_bad_byte_token_is_a_clear_error(gemma3):
    metadata = open_gguf(gemma3).metadata
    tokens = list(metadata["tokenizer.ggml.tokens"])
    tokens[tokens.index("<0x41>")] = "<0x-1>"
    with pytest.raises(TokenizerError, match="byte token"):
        Tokenizer({**metadata, "tokenizer.ggml.tokens": tokens})


def test_decode_rejects_ids_outside_the_vocab(smollm2):
    tok = Tokenizer(open_gguf(smollm2).metadata)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


@pytest.fixture(scope="module")
def harmony_vocab(smollm2, tmp_path_factory):
    """SmolLM2's vocab with gpt-oss's control tokens added (control, as in the real file) and its chat template."""
    from pathlib import Path
    meta = open_gguf(smollm2).metadata
    template = (Path(__file__).parent / "templates" / "openai-gpt-oss-120b.jinja").read_text()
    path = write_vocab_only(smollm2, tmp_path_factory.mktemp("harmony") / "harmony.gguf",
                            tokenizer__ggml__tokens=list(meta["tokenizer.ggml.tokens"]) + HARMONY_TOKENS,
                            tokenizer__ggml__token_type=np.append(meta["tokenizer.ggml.token_type"],
                                                                  [3] * len(HARMONY_TOKENS)).astype(np.int32),
                            tokenizer__chat_template=template)
    return Tokenizer(open_gguf(path).metadata), Oracle(path), open_gguf(path).metadata


def test_harmony_markup_is_shown_and_parsed_as_llama_cpp_does(harmony_vocab):
    """llama.cpp makes <|channel|>, <|message|>, <|start|> and <|constrain|> user-defined: shown in every reply and
    matched in plain text too; <|end|> stays control but ends no reply, and a reply shows it (llama-server's
    preserved tokens) so that its channels can be split."""
    tok, oracle, _ = harmony_vocab
    ids = [tok.vocab[t] for t in HARMONY_TOKENS]
    assert [tok.token_to_piece(i, special) for i in ids for special in (False, True)] == \
        [oracle.piece(i, special) for i in ids for special in (False, True)]
    texts = ["<|start|>assistant<|channel|>final<|message|>Hi<|end|>", "a <|constrain|>json <|return|> b"]
    assert mismatches(tok, oracle, texts) == []
    assert tok.eog_ids == {i for i in range(tok.vocab_size) if oracle.is_eog(i)}
    assert tok.vocab["<|end|>"] not in tok.eog_ids and tok.vocab["<|return|>"] in tok.eog_ids
    reply = tok.encode("<|channel|>analysis<|message|>Hm<|end|><|start|>assistant<|channel|>final<|message|>Hi",
                       add_special=False, parse_special=True)
    stream = tok.stream(at_start=False)
    assert "".join(stream.push(i) for i in reply) == \
        "<|channel|>analysis<|message|>Hm<|end|><|start|>assistant<|channel|>final<|message|>Hi"


def test_gpt_oss_prompt_tokens_equal_llama_cpp(harmony_vocab):
    """The harmony template rendered for a conversation (system prompt, two turns, a reply's reasoning), as tokens:
    ours against llama.cpp's tokens of llama-cpp-python's rendering."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from models.chat_template import load_chat_template
    from tests.models.test_chat_template import GPT_OSS
    tok, oracle, meta = harmony_vocab
    ours = tok.encode_prompt(load_chat_template(meta).render(GPT_OSS, reasoning_effort="high"))
    reference = Jinja2ChatFormatter(meta["tokenizer.chat_template"], eos_token="", bos_token="")
    theirs = oracle.tokenize(reference(messages=GPT_OSS, reasoning_effort="high").prompt, tok.add_bos, True)
    assert ours == theirs
    assert [ours.count(tok.vocab[t]) for t in ("<|start|>", "<|end|>", "<|channel|>")] == [6, 5, 1]  # 1: first reply


VOCAB_4 = 32768


@pytest.fixture(scope="module")
def gemma4_vocab(gemma3, tmp_path_factory):
    """Gemma 3's vocabulary as a gemma4 tokenizer (BPE with merges, no space prefix): its merges every split of a
    token into two (spm_merges: what SentencePiece would merge first, first), those of tokens with a space left out
    (a merge line splits at a space), and those that make a run of newlines, whose tokens are made normal ones
    (Gemma 3's are user-defined, split out first anyway): llama.cpp looks a run up whole, where merging would not get
    there. Gemma 4's own vocabulary is not in any package; the algorithm is what this checks, on Gemma 3's first
    VOCAB_4 tokens (its controls, newline runs, bytes and most common words; a smaller file, loaded in seconds)."""
    from models.tokenizer import NORMAL, spm_merges
    meta = open_gguf(gemma3).metadata
    tokens, types = meta["tokenizer.ggml.tokens"][:VOCAB_4], np.array(meta["tokenizer.ggml.token_type"][:VOCAB_4])
    scores = np.asarray(meta["tokenizer.ggml.scores"][:VOCAB_4])
    types[[i for i, t in enumerate(tokens) if t and not t.strip("\n")]] = NORMAL
    merges = [f"{a} {b}" for a, b in spm_merges(tokens, scores) if " " not in a + b and (a + b).strip("\n")]
    return write_vocab_only(gemma3, tmp_path_factory.mktemp("gemma4") / "gemma4-vocab.gguf",
                            tokenizer__ggml__model="gemma4", tokenizer__ggml__merges=merges,
                            tokenizer__ggml__tokens=tokens, tokenizer__ggml__token_type=types,
                            tokenizer__ggml__scores=scores,
                            tokenizer__ggml__pre=None, tokenizer__ggml__add_space_prefix=None,
                            tokenizer__ggml__add_bos_token=False)


def test_gemma4_tokenizer_equals_llama_cpp(gemma4_vocab):
    """BPE over ▁ text split at newlines, a newline run whole, <0xXX> bytes, BOS added though the file says not."""
    tok, oracle = Tokenizer(open_gguf(gemma4_vocab).metadata), Oracle(gemma4_vocab)
    texts = CORPUS + random_strings(seed=3, n=300) + ["a\n\n\nb", "\n" * 5 + "x  y", " lead and trail "]
    assert mismatches(tok, oracle, texts) == []
    assert tok.encode("Hi")[0] == tok.bos_id
    ids = [oracle.tokenize(text, True, True) for text in CORPUS]
    assert [tok.decode_bytes(i) for i in ids] == [oracle.detokenize(i, False) for i in ids]
    assert all(tok.token_to_piece(i) == oracle.piece(i, False) for i in range(0, tok.vocab_size, 97))
