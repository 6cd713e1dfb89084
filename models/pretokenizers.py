"""How llama.cpp splits text into words before byte-level BPE, per tokenizer.ggml.pre.

Copied from llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp, as vendored by llama-cpp-python 0.3.36).
Each regex splits every piece the previous one left, keeping matches and the text between them
(tokenizers' Split(behavior="isolated") does the same). llama.cpp runs the gpt2, llama3 and qwen2 patterns
through hand-written matchers that also take a lone trailing `\\s+`, so those carry an explicit `|\\s+`.
"""
from dataclasses import dataclass

from models.errors import UserError


class UnknownPreTokenizer(UserError, ValueError):
    pass


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is a whole vocab token is taken as is
    clean_spaces: bool = True    # detokenize drops the space before ?!., and some contractions
    add_bos: bool = False        # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# llama.cpp's rewrite of \p{Lu}*\p{Ll}+ for std::regex: a letter that is not a-z, then letters that are not A-Z
UPPER_LOWER = r"((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
LOWER_AFTER_UPPER = r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{UPPER_LOWER}|[^\r\n\p{{L}}\p{{N}}]?{LOWER_AFTER_UPPER}"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{UPPER_LOWER}{CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{LOWER_AFTER_UPPER}{CONTRACTIONS}?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_LLM_WORDS = (  # letters of many scripts, written as escapes to survive editors
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a"
    "-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
    "\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00"
    "-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
    "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+"
)
DEEPSEEK_V3_WORDS = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                     "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
# llama.cpp runs the deepseek patterns through std::regex after turning every non-ASCII space into \v, so
# their literal ranges (U+0800-U+4E00 holds U+2028 and U+3000) never match a space: `&&[^\s]` says so here.
DEEPSEEK_CJK = "[一-龥ࠀ-一가-퟿&&[^\\s]]+"
DEEPSEEK_LLM_PUNCT = "\\s?[!-/:-~！-／：-～‘-‟　-。&&[^\\s]]+"

DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
LLAMA3_PRE = PreTokenizer((LLAMA3,), ignore_merges=True, add_bos=True)
STARCODER = PreTokenizer((r"\p{N}", GPT2))
GPT2_PRE = PreTokenizer((GPT2,))
QWEN2_PRE = PreTokenizer((QWEN2,), clean_spaces=False)

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": DEFAULT,
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
                    LLAMA3_PRE),
    "dbrx": PreTokenizer((LLAMA3,)),
    "smaug-bpe": PreTokenizer((LLAMA3,)),
    "deepseek-llm": PreTokenizer(("[\r\n]", DEEPSEEK_LLM_WORDS, DEEPSEEK_LLM_PUNCT,
                                  r"\s+$", DEEPSEEK_CJK, r"\p{N}+"), clean_spaces=False),
    "deepseek-coder": PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"),
                                   clean_spaces=False),
    "deepseek-v3": PreTokenizer((r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK_V3_WORDS), clean_spaces=False),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]")),
    **dict.fromkeys(["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"], STARCODER),
    "smollm": PreTokenizer((r"\p{N}", GPT2), clean_spaces=False),
    "command-r": PreTokenizer((r"\p{N}", GPT2), clean_spaces=False),
    **dict.fromkeys(["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4"], GPT2_PRE),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"], QWEN2_PRE),
    "stablelm2": PreTokenizer((QWEN2,)),
    "megrez": PreTokenizer((QWEN2,)),
    "poro-chat": PreTokenizer((BLOOM,), clean_spaces=False),
    "bloom": PreTokenizer((BLOOM,)),
    "gpt3-finnish": PreTokenizer((BLOOM,)),
    "viking": PreTokenizer((BLOOM, r"\p{N}"), clean_spaces=False),
    "tekken": PreTokenizer((TEKKEN,), ignore_merges=True, clean_spaces=False, add_bos=True),
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie"], PreTokenizer((GPT4O,), clean_spaces=False)),
}


def pre_tokenizer_for(name: str | None) -> PreTokenizer:
    """The split rules for a tokenizer.ggml.pre value; a missing value means llama.cpp's 'default'."""
    if name is None:
        return DEFAULT
    if name not in PRE_TOKENIZERS:
        raise UnknownPreTokenizer(f"unknown pre-tokenizer '{name}' (tokenizer.ggml.pre); "
                                  f"known: {', '.join(sorted(PRE_TOKENIZERS))}")
    return PRE_TOKENIZERS[name]
