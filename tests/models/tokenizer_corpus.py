"""Strings the tokenizer must split exactly like llama.cpp: scripts, emoji, code, whitespace, numbers, text
that looks like special tokens, and the empty string; and seeded random strings built from awkward pieces."""
import random

SCRIPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Ça va? Très bien, merci. Où est la bibliothèque?",
    "Größenwahn und Straße: ÄÖÜ äöü ß ẞ",
    "İstanbul'da ılık bir gün; ĞÜŞİÖÇ ğüşiöç",
    "Tiếng Việt có dấu: Người đẹp, phở bò, cà phê sữa đá.",
    "Ελληνικά: Καλημέρα κόσμε, ΑΒΓΔ αβγδ ς",
    "Русский текст: Съешь же ещё этих мягких французских булок.",
    "Українська: Ґанок, їжак, є, і.",
    "العربية: مرحبا بالعالم، كيف حالك؟",
    "עברית: שלום עולם! מה שלומך?",
    "हिन्दी: नमस्ते दुनिया, आप कैसे हैं?",
    "বাংলা: আমি বাংলায় গান গাই।",
    "தமிழ்: வணக்கம் உலகம்",
    "ภาษาไทย: สวัสดีชาวโลก ยินดีต้อนรับ",
    "中文：你好，世界！我们今天去公园散步吧。",
    "繁體中文：臺灣的書法藝術歷史悠久。",
    "日本語：こんにちは、世界。カタカナとひらがなと漢字。",
    "한국어: 안녕하세요, 세계! 반갑습니다.",
    "ქართული: გამარჯობა მსოფლიო",
    "Հայերեն: Բարեւ աշխարհ",
    "አማርኛ: ሰላም ለዓለም",
    "བོད་ཡིག་: བཀྲ་ཤིས་བདེ་ལེགས།",
    "ខ្មែរ: សួស្តី​ពិភពលោក",
    "Монгол: ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ",
    "ᚠᚢᚦᚨᚱᚲ runes and 𐌰𐌱𐌲 Gothic",
    "Cafe\u0301 with a combining accent vs Café precomposed",
    "Z̷̢̛a̸̡͝l̶̨͘g̵̢̕ȯ̶̧ ̷͚̕t̸͇̿e̶͙͝x̸̺̀t̵̛̫",
    "\u0301 a lone combining mark",
    "mixed: English, français, 中文, العربية, हिन्दी, 日本語 in one line",
    "ﬁnancial ﬂow with ligatures ﬀ ﬃ",
    "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
    "Ⓐⓑⓒ ① ② ③ ㈠ ㈡",
    "Mathematical 𝐀𝐁𝐂 𝑥𝑦𝑧 𝔸𝔹ℂ ∀x∈ℝ: x²≥0",
    "Quotes: “double” ‘single’ «guillemets» „low“ 「括弧」",
    "Dashes — and – and ‐ and ‒ and ―",
    "Ellipsis… bullets • ◦ ‣ and arrows → ← ↔ ⇒",
    "Currency: $100 €200 £300 ¥400 ₹500 ₿0.01",
    "Symbols: © ® ™ § ¶ † ‡ ° ± × ÷ ∞ ≈ ≠",
    "Box drawing: ┌─┬─┐ │ │ └─┴─┘",
    "Braille ⠓⠑⠇⠇⠕ and musical 𝄞 ♩ ♪ ♫",
]

EMOJI = [
    "😀", "👍", "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿",
    "👩‍👩‍👧‍👦 family", "👨‍💻 coding", "🧑🏽‍🚀 astronaut", "🏳️‍🌈 flag", "🏴‍☠️ pirate",
    "❤️ red heart with variation selector", "❤ plain heart",
    "🇺🇸🇬🇧🇯🇵 flags", "1️⃣ 2️⃣ #️⃣ keycaps",
    "🤷‍♀️🤷‍♂️", "👁️‍🗨️", "emoji in text 🎉🎉🎉 party!!!",
    "🙂🙃😉😊😇🥰😍🤩😘", "🫠🫡🫥 newer emoji", "💩" * 5,
    "👨🏿‍❤️‍💋‍👨🏻", "text👍no spaces😀between",
]

CODE = [
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "const f = (x) => x ** 2; // arrow\nconsole.log(f(3));",
    '{"name": "gguf", "version": 3, "tensors": [1, 2, 3], "ok": true, "none": null}',
    "<html><body><h1>Title</h1><p class=\"x\">Hi &amp; bye</p></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "fn main() { println!(\"{}\", vec![1, 2, 3].iter().sum::<i32>()); }",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "if [[ -f \"$HOME/.bashrc\" ]]; then source ~/.bashrc; fi",
    "re.compile(r'^(?P<key>[a-z_]+)=(?P<val>.*)$')",
    "```python\nprint('hello')\n```",
    "x_1 = arr[:, ::2] @ W.T + b  # numpy",
    "class Foo(Base):\n    \"\"\"Doc.\"\"\"\n\n    def __init__(self):\n        super().__init__()\n",
    "   indented_with_spaces = True",
    "\t\tindented_with_tabs = True",
    "a==b!=c<=d>=e&&f||g<<h>>i",
    "// comment\n/* block */\n/** doc */",
    "camelCaseVariable snake_case_variable SCREAMING_CASE kebab-case",
    "0x1F 0b1010 0o755 1_000_000 3.14e-10",
    "lambda x: {k: v for k, v in x.items() if v}",
    "git commit -m \"fix: don't crash\" && git push origin main",
    "$ pip install --upgrade 'tokenizers>=0.20'",
    "<?xml version=\"1.0\"?><root attr='1'/>",
    "| col1 | col2 |\n|------|------|\n| a    | b    |",
    "C:\\Users\\name\\Documents\\file.txt",
]

WHITESPACE = (
    [" " * n for n in (1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 40)]
    + ["\t" * n for n in (1, 2, 5, 31, 35)]
    + ["\n" * n for n in (1, 2, 3, 10, 31, 32, 45)]
    + [
        "a b", "a  b", "a   b", "a\tb", "a\t\tb", "a \tb", "a\t b", "a\nb", "a\n\nb", "a \n b", "a\r\nb",
        "line1\r\nline2\r\nline3\r\n", "\r", "\r\n", "\r\n\r\n", "cr\ronly", " leading", "trailing ", "  both  ",
        "tab\tseparated\tvalues\n1\t2\t3", "mixed \t \n \r\n whitespace", "\x0b vertical tab \x0c form feed",
        "non\u00a0breaking\u00a0space", "ideographic\u3000space", "em\u2003space en\u2002space thin\u2009space",
        "zero\u200bwidth\u200bspace", "next\u0085line", "line\u2028separator\u2029paragraph",
        "\ufeffbyte order mark", "right\u200fto\u200eleft marks", "word\u00adsoft\u00adhyphen",
        "    \n    \n", "\n \n \n", " \n", "\n ", "   x   ", "\t\n\t\n",
        "▁ lower one eighth block ▁▁", "▁▁▁▁",
    ]
)

NUMBERS = [
    "0", "7", "42", "123", "1234", "12345", "123456789012345678901234567890",
    "3.14159", "-42", "+7", "1e10", "6.022e23", "1,000,000", "1.000.000,50", "50%", "$19.99",
    "2024-01-15", "12:34:56", "10:30pm", "v1.2.3", "192.168.0.1", "+1 (555) 123-4567",
    "١٢٣٤٥ Arabic-Indic", "۱۲۳ Persian", "१२३४ Devanagari", "５６７ fullwidth", "½ ¼ ¾ ⅓",
    "Ⅻ Ⅳ roman numerals", "x² y³ z⁴ superscripts", "H₂O subscripts", "1st 2nd 3rd 4th", "000123", "007",
]

CONTRACTIONS = [
    "I'm here, you're there, we've been, they'd go, she'll come, it's fine, don't.",
    "I'M SHOUTING, YOU'RE TOO, WE'VE, THEY'D, SHE'LL, IT'S, DON'T",
    "It'S mIxEd CaSe'Ll", "'tis the season", "rock 'n' roll", "y'all'd've", "it’s curly", "l'homme d'affaires",
    "'s", "'", "''", "'''", "can't won't shan't", "the dog's bone, the dogs' bones", "o'clock O'Brien",
    "He said 'hello' and left", "\"quoted\" and 'single'",
    "Wait . What ? Yes ! No , ok", "it ' s a lone ' quote ' ", "I 'm you 're we 've he 's she 'll they 'd it 't",
]

URLS = [
    "https://example.com", "https://example.com/path/to/page?query=1&other=two#frag",
    "http://localhost:8080/api/v1/users/42", "ftp://files.example.org/pub/file.tar.gz",
    "mailto:someone@example.com", "user.name+tag@sub.domain.co.uk", "www.example.com/ünïcödé/路径",
    "https://huggingface.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M", "/usr/local/bin/python3.11",
    "~/.cache/huggingface/hub", "../relative/./path", "file:///C:/Windows/System32",
    "@username #hashtag $TICKER", "example.com:443",
]

SPECIAL_LOOKING = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<start_of_image>", "<end_of_image>",
    "<unused0>", "<unused42>", "[multimodal]", "<0x41>", "<0x0A>", "<s>", "</s>", "[INST] hi [/INST]",
    "<|eot_id|>", "<|begin_of_text|>", "<reponame>", "<filename>", "<file_sep>", "<fim_prefix>", "<fim_pad>",
    "<|im_start", "im_end|>", "<<|im_end|>>", "<|im_end|><|im_end|>", "text<|im_end|>text",
    " <|im_end|> ", "<|IM_END|>", "<end_of_turn><eos>", "a<bos>b", "<h1>", "<table>", "<br>",
]

EDGE = [
    "", "a", "Z", " ", ".", "?", "!", "\n", "\t", "é", "中", "😀", "ß", "\u200d", "~", "\\", "\"", "`",
    "a\x00b", "\x01\x02\x03", "\x7f", "\ue000 private use", "\ufffd replacement", "\U0001f9ff",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "!!!!!!!!!!!!!!!", "................",
    "————————", "________________", "================", "Supercalifragilisticexpialidocious",
    "pneumonoultramicroscopicsilicovolcanoconiosis", "ALLCAPSWORDWITHOUTSPACES", "a.b.c.d.e.f",
    "Hello, world!", "Hello world", " Hello world", "hello", " hello", "HELLO", "Hello\nworld",
]

CORPUS: list[str] = SCRIPTS + EMOJI + CODE + WHITESPACE + NUMBERS + CONTRACTIONS + URLS + SPECIAL_LOOKING + EDGE

# Pieces for seeded random strings: scripts, marks, emoji parts, every kind of space, digits of other
# scripts, unassigned code points (U+65827, U+1AB5F), a private-use one, special-token texts and fragments.
RANDOM_PIECES = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789      \n\n\t\r") + list(
    ".,;:!?'\"-_()[]{}<>|/\\@#$%^&*+=~`") + [
    "é", "ß", "ü", "ñ", "É", "Ω", "中", "文", "の", "ア", "한", "ا", "ה", "я", "Я", "ω", "क", "्", "\u0301",
    "😀", "👍🏽", "\u200d", "❤️", "🇫🇷", "▁", "\u00a0", "\u3000", "\u2028", "\x85", "\x0b", "\x1c", "\u2003",
    "\u200b", "\ufeff", "'s", "'S", "'ll", "'LL", "'re", "the", " the", "ing", "http://", "123", "12345", "\r\n",
    "  ", "\t\t", "١٢", "½", "²", "Ⅻ", "ǅ", "ʰ", "\U00065827", "\U0001ab5f", "\ue000", "<|im_end|>", "<|im_start|>",
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "im_", "<unused",
]


def random_strings(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(RANDOM_PIECES) for _ in range(rng.randint(0, 40))) for _ in range(n)]
