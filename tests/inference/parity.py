"""llama.cpp (llama-cpp-python) as the logits oracle, and the four parity measures of the issue."""
import numpy as np

PROMPTS = [
    "The history of the Roman Empire spans more than a thousand years, from the founding of the city to the fall "
    "of Constantinople. Historians often divide it into the Republic, the Principate and the Dominate, and each "
    "period had its own institutions, wars and emperors who shaped the Mediterranean world. Its roads, laws and language outlived the empire by many centuries.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n\n\nif __name__ == '__main__':\n    for i in range(10):\n"
    "        print(i, fibonacci(i))\n",
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light energy into chemical "
    "energy. Carbon dioxide and water are combined to make glucose, and oxygen is released as a by-product. The "
    "reactions take place in the chloroplasts, which contain the pigment chlorophyll. Without it, nearly all life on Earth would soon run out of food.",
    "Dear Sir or Madam, I am writing to complain about the delivery of my order number 48213, which arrived three "
    "weeks late and with a broken lid. I would like a full refund or a replacement as soon as possible. Yours "
    "faithfully, Margaret Thompson, 14 Elm Street, Bristol. P.S. Please reply by email rather than by post.",
    "Q: What is 17 multiplied by 23?\nA: 17 x 23 = 391.\nQ: What is the square root of 144?\nA: 12.\n"
    "Q: How many days are there in a leap year?\nA: 366.\nQ: What is the boiling point of water at sea level?\nA:",
    "Once upon a time, in a small village at the edge of a dark forest, there lived an old woodcutter and his "
    "daughter. Every morning he walked into the trees with his axe, and every evening she waited by the window "
    "for the sound of his footsteps on the frozen path. One winter night, he did not come home.",
]
N_POSITIONS = 64


def oracle(path, **kwargs):
    """llama_cpp.Llama(path, **kwargs) as the tests' oracle: without llama.cpp's extra buffer types (AMX tiles,
    repacked weights), which change its speed, not its logits, and whose AMX path crashes on VMs that advertise
    AMX without letting the guest use it (app/llamacpp_peer.py)."""
    from app.llamacpp_peer import llama
    return llama(path, extra_buffer_types=False, verbose=False, **kwargs)


def oracle_logits(path, prompts=PROMPTS, n=N_POSITIONS, **kwargs):
    """(token ids, llama.cpp logits [n, n_vocab]) for each prompt: its first n tokens, BOS included; kwargs go to
    llama_cpp.Llama (e.g. type_k, type_v: the KV cache's ggml type)."""
    llm = oracle(path, logits_all=True, n_ctx=n, n_batch=n, n_threads=2, **kwargs)
    out = []
    for text in prompts:
        ids = llm.tokenize(text.encode(), add_bos=True)[:n]
        assert len(ids) == n, "a parity prompt must give at least n tokens"
        llm.reset()
        llm.eval(ids)
        out.append((ids, np.array(llm.scores[:n], np.float32)))
    llm.close()
    return out


def parity(ours: list[np.ndarray], theirs: list[np.ndarray]) -> dict:
    """The four measures of agreement between two teacher-forced logit sets, over every position."""
    ours, theirs = np.concatenate(ours), np.concatenate(theirs)
    top2 = np.sort(theirs, axis=1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] > 0.5  # near-ties may flip: llama.cpp rounds activations to 8 bits
    same = ours.argmax(1) == theirs.argmax(1)
    corr = np.array([np.corrcoef(a, b)[0, 1] for a, b in zip(ours, theirs)])
    return dict(decided_mismatches=int(np.count_nonzero(decided & ~same)), agreement=float(same.mean()),
                corr_mean=float(corr.mean()), corr_min=float(corr.min()))


def assert_parity(m: dict) -> None:
    assert m["decided_mismatches"] == 0, m
    assert m["agreement"] >= 0.94, m
    assert m["corr_mean"] >= 0.998, m
    assert m["corr_min"] >= 0.98, m
