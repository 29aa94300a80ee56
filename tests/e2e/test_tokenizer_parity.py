"""Token-id parity of `symprune tokenize` with the Python reference tokenizers.

SentencePiece tokenizer.model vs the `sentencepiece` package; Hugging Face tokenizer.json (LLaMA-3 and
GPT-2 files built here) vs `tokenizers`; GPT-2 vocab.json + merges.txt vs transformers'
GPT2TokenizerFast; llama2.c tokenizer.bin vs a pure-Python port of run.c's encode() and, on plain
text, vs sentencepiece with the matching tokenizer.model. Every comparison asserts identical ids.
"""
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

DATA = Path(os.environ["SYMPRUNE_DATA"])
BIN = os.environ["SYMPRUNE_BIN"]
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

SAMPLES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "  leading spaces and trailing   ",
    "tabs\tand\t\ttabs",
    "new\nline\n\n\nthree newlines\r\nand CRLF\n",
    "\n\n\n",
    "    \n    \n",
    "spaces          run\u00a0nbsp\u3000ideographic space",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber se\u00f1or \u00c5ngstr\u00f6m e\u0301 (combining)",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4",
    "emoji \U0001f917\U0001f600 \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f1eb\U0001f1f7 \u2764\ufe0f",
    "digits 1234567890123456789 3.14159 2023-11-21 1,000,000 007",
    "don't I'll we've they're she'd it's 'S 'LL O'Neil",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 \u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947 \u03b1\u03b2\u03b3 \u2211\u222b\u221e",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // ok?!",
    "<|begin_of_text|>Hello<|end_of_text|> <|endoftext|> <s> </s> <unk>",
    "a<|begin_of_text|> <|begin_of_text|>b<|eot_id|>\n<|start_header_id|>user<|end_header_id|>",
    " = Robert Boulter = \n Robert Boulter is an English film , television and theatre actor .",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!!!!!!!!!!!!!!!!!!!!???...",
    # Unicode whitespace and format characters where regex engines could disagree on \s, \p{L}, \p{N}.
    "a\u0085b \u2028c\u2029 d\u200be\ufeff f\u000bg\u000ch\u001fi\u001cj \u180e k\u2007l\u202fm\u205fn",
    "x\u00adz \u01c5 \u216b \u00bd \u00b2 \u0661\u0662\u0663 \u0d67\u0d68 \U0001F600\U0001F3FB \U000E0001",
    # U+180E is not White_Space since Unicode 6.3, but PCRE2's \s (with UCP) still matches it.
    "x\u180e't \u180e<s a\u180eb\u180e\u180e 1\u180e2 \u180e\n\u180e",
]


def head(path: Path, n: int) -> str:
    """First ~n bytes of a UTF-8 text file, cut at a character boundary."""
    return path.read_bytes()[:n].decode("utf-8", errors="ignore")


WIKITEXT = DATA / "wikitext2" / "wiki.test.hf_rows_joined_nn.txt"
TINYSTORIES = DATA / "tinystories" / "tinystories_val.txt"
LONG_TEXTS = [head(WIKITEXT, 50_000), head(TINYSTORIES, 50_000)]
# Long runs stress the pre-tokenizer regex (backtracking in \s+(?!\S)) and the merge loops.
STRESS = [" " * 200_000 + "end" + "\t \n" * 30_000 + "x" + "\n" * 50_000, "1" * 10_000, "!?" * 50_000]


def symprune_ids(tokenizer, texts, tmp_path, bos=False):
    batch = tmp_path / "texts.json"
    batch.write_text(json.dumps(texts), encoding="utf-8")
    cmd = [BIN, "tokenize", "--tokenizer", str(tokenizer), "--texts-json", str(batch)]
    if not bos:
        cmd.append("--no-bos")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def assert_same(ours, reference, texts):
    assert len(ours) == len(reference)
    for got, want, text in zip(ours, reference, texts):
        assert got == want, f"mismatch for {text[:80]!r}"


# ---- SentencePiece (LLaMA-2) ---------------------------------------------------------------------


def test_sentencepiece_model_matches_python(tmp_path):
    import sentencepiece as spm

    model = DATA / "llama2c_tokenizer" / "tokenizer.model"
    sp = spm.SentencePieceProcessor(model_file=str(model))
    texts = SAMPLES + LONG_TEXTS
    assert_same(symprune_ids(model, texts, tmp_path), [sp.encode(t) for t in texts], texts)
    with_bos = symprune_ids(model, SAMPLES, tmp_path, bos=True)
    assert_same(with_bos, [[1] + sp.encode(t) for t in SAMPLES], SAMPLES)


@pytest.mark.parametrize("rules", ["nmt_nfkc", "nmt_nfkc_cf", "custom_tsv"])
def test_sentencepiece_normalization_rules_match_python(tmp_path, rules):
    """Models whose precompiled_charsmap holds real rules (NFKC, case folding, a rule table) are checked
    before use (io/sentencepiece_model_check.cc) and must still normalize exactly as Python does."""
    import io

    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(head(TINYSTORIES, 60_000), encoding="utf-8")
    options = {"normalization_rule_name": rules}
    if rules == "custom_tsv":
        table = tmp_path / "rules.tsv"  # code points in hex: "AB" -> "ab", fullwidth 1 -> 1, "CD" -> "c"
        table.write_text("41\t61\n42\t62\nFF11\t31\n43 44\t63\n", encoding="utf-8")
        options = {"normalization_rule_tsv": str(table)}
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(input=str(corpus), model_writer=proto, vocab_size=120, minloglevel=2, **options)
    model = tmp_path / "tokenizer.model"
    model.write_bytes(proto.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(model))
    texts = SAMPLES + ["AB CD \uff11 \uff28\uff45\uff4c\uff4c\uff4f \ufb01 Caf\u00e9 \u2460 \u3392 \u00c5"]
    # The rules are in use (not the identity): each pair below is normalized to the same text.
    folded = {"nmt_nfkc": ("\uff28\uff45\uff4c\uff4c\uff4f", "Hello"), "nmt_nfkc_cf": ("HELLO", "hello"),
              "custom_tsv": ("AB", "ab")}[rules]
    assert sp.encode(folded[0]) == sp.encode(folded[1])
    texts += list(folded)
    assert_same(symprune_ids(model, texts, tmp_path), [sp.encode(t) for t in texts], texts)


@pytest.mark.parametrize("variant", ["bpe", "char", "word", "user_defined_prefixes", "byte_fallback_bpe",
                                     "denormalization_tsv", "whitespace_suffix"])
def test_trained_sentencepiece_models_of_every_kind_match_python(tmp_path, variant):
    """The pre-load check must accept what the sentencepiece trainer writes, whatever the model kind or
    option (model types, nested user-defined symbols, byte fallback, denormalization rules), with ids
    identical to Python's."""
    import io

    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(head(TINYSTORIES, 60_000), encoding="utf-8")
    options = {
        "bpe": {"model_type": "bpe"},
        "char": {"model_type": "char", "vocab_size": 60},
        "word": {"model_type": "word", "vocab_size": 300},
        "user_defined_prefixes": {"user_defined_symbols": ["<t>", "<t><t>", "<t><t><t>", "Once", "Once upon"]},
        "byte_fallback_bpe": {"model_type": "bpe", "byte_fallback": True, "vocab_size": 400},
        "denormalization_tsv": {"denormalization_rule_tsv": str(tmp_path / "denorm.tsv")},
        "whitespace_suffix": {"treat_whitespace_as_suffix": True},
    }[variant]
    (tmp_path / "denorm.tsv").write_text("2581\t20\n61\t41\n", encoding="utf-8")  # decoding: "a" -> "A"
    options = {"vocab_size": 120, **options}
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(input=str(corpus), model_writer=proto, minloglevel=2, **options)
    model = tmp_path / "tokenizer.model"
    model.write_bytes(proto.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(model))
    texts = SAMPLES + ["<t><t><t><t> Once upon a time, Once upon"]
    assert_same(symprune_ids(model, texts, tmp_path), [sp.encode(t) for t in texts], texts)


# ---- Hugging Face tokenizer.json -----------------------------------------------------------------


def test_llama3_tokenizer_json_matches_tokenizers(tmp_path):
    from tokenizers import Tokenizer

    path = DATA / "llama3_tokenizer" / "tokenizer.json"
    ref = Tokenizer.from_file(str(path))
    texts = SAMPLES + LONG_TEXTS + STRESS
    assert_same(symprune_ids(path, texts, tmp_path), [ref.encode(t).ids for t in texts], texts)
    # This tokenizer.json's post-processor adds nothing; tokenizer_config.json's bos_token gives BOS.
    with_bos = symprune_ids(path.parent, SAMPLES[:3], tmp_path, bos=True)
    assert_same(with_bos, [[128000] + ref.encode(t).ids for t in SAMPLES[:3]], SAMPLES[:3])
    specials = ref.encode("<|begin_of_text|>x<|eot_id|>").ids
    assert specials[0] == 128000 and specials[-1] == 128009


def test_llama3_template_processing_gives_bos(tmp_path):
    """A tokenizer.json with LLaMA-3's newer TemplateProcessing post-processor: BOS comes from it."""
    from tokenizers import Tokenizer, processors

    ref = Tokenizer.from_file(str(DATA / "llama3_tokenizer" / "tokenizer.json"))
    ref.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", 128000)])
    path = tmp_path / "llama3" / "tokenizer.json"
    path.parent.mkdir()
    ref.save(str(path))
    texts = SAMPLES[:4]
    assert_same(symprune_ids(path, texts, tmp_path, bos=True), [ref.encode(t).ids for t in texts], texts)
    assert ref.encode("Hi").ids[0] == 128000


# Qwen2's tokenizer.json (Qwen/Qwen2.5-7B): an NFC normalizer, then this split and a ByteLevel without
# its own regex. Its vocabulary is not among the test assets; LLaMA-3's, of the same tiktoken lineage,
# stands in.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Text that NFC changes: decomposed accents, marks out of canonical order, singletons, Hangul jamo.
NFC_TEXTS = [
    "Cafe\u0301 nai\u0308ve re\u0301sume\u0301 \u212bngstr\u00f6m \u2126 \uf900\uf901",
    "C\u0301\u0327 a\u0302\u0323 a\u0301\u0301 \u0301leading \u0958\u0344 \ufb01",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af \uac00\u11a8",
    "e\u0301x\u0301 <|im_start|>e\u0301<|im_end|>",
]


def random_nfc_texts(count, seed):
    """Strings that NFC reworks: starters, combining marks of several classes, precomposed letters, jamo."""
    import random
    import unicodedata
    rng = random.Random(seed)
    pool = ([chr(c) for c in range(0x41, 0x7b)] + [chr(c) for c in range(0x300, 0x370)] +
            [chr(c) for c in range(0xc0, 0x250)] + [chr(c) for c in range(0x1e00, 0x1f00)] +
            [chr(c) for c in range(0x1100, 0x1113)] + [chr(c) for c in range(0x1161, 0x1176)] +
            [chr(c) for c in range(0x11a7, 0x11c3)] + list("\u0591\u05b0\u05bc\u0e38\u0e48\u3099\u309a"
                                                            "\u304b\u30cf \u0915\u093c\u0b47\u0b3e"))
    texts = []
    for _ in range(count):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        texts.append(text if rng.random() < 0.5 else unicodedata.normalize("NFD", text))
    return texts


def byte_tokenizer_json(path, normalizer):
    """A byte-level BPE without merges whose id of each byte is the byte: ids give the normalized text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = ByteLevel.alphabet()
    # ByteLevel's byte -> character map: the printable bytes map to themselves, the rest to U+0100 on.
    b2u, n = {}, 0
    for b in range(256):
        if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff:
            b2u[b] = chr(b)
        else:
            b2u[b] = chr(256 + n)
            n += 1
    assert set(b2u.values()) == set(alphabet)
    tok = Tokenizer(models.BPE({b2u[b]: b for b in range(256)}, []))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def test_nfc_normalizer_matches_tokenizers_on_every_code_point(tmp_path):
    """symprune's NFC against the tokenizers package's, read back through a tokenizer whose ids are the
    normalized text's bytes: every code point in runs, every canonical decomposition (which NFC must compose
    back, or not), and random mark sequences. It is also Python's unicodedata (Unicode 14.0) wherever
    tokenizers' older tables agree with that; they differ on the 98 marks assigned in Unicode 10 and later (class 0
    in tokenizers, so never reordered) and on U+11938."""
    import unicodedata
    from tokenizers import normalizers
    path = tmp_path / "bytes" / "tokenizer.json"
    ref = byte_tokenizer_json(path, normalizers.NFC())
    points = [chr(c) for c in range(1, 0x110000) if not 0xd800 <= c <= 0xdfff]  # texts hold no NUL
    decomposed = [unicodedata.normalize("NFD", p) for p in points]
    decomposed = [d for d, p in zip(decomposed, points) if d != p]
    texts = ["".join(points[i:i + 4096]) for i in range(0, len(points), 4096)]
    texts += ["|".join(decomposed[i:i + 512]) for i in range(0, len(decomposed), 512)]
    texts += NFC_TEXTS + random_nfc_texts(3000, seed=11)
    ours = symprune_ids(path, texts, tmp_path)
    assert_same(ours, [ref.encode(t).ids for t in texts], texts)
    python_nfc = [unicodedata.normalize("NFC", t) for t in texts]
    same_as_python = [bytes(ids).decode("utf-8") == want for ids, want in zip(ours, python_nfc)]
    assert sum(same_as_python) == len(texts) - 5  # four runs of code points hold new marks, one U+11938
    assert sum(t != want for t, want in zip(texts, python_nfc)) > 1000  # NFC changed many


def test_qwen2_style_tokenizer_json_matches_tokenizers(tmp_path):
    """Qwen2's normalizer and pre-tokenizer on LLaMA-3's vocabulary, with Qwen2's special tokens (matched
    in the raw text) and a normalized added token (matched after NFC, by its NFC form)."""
    from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers
    ref = Tokenizer.from_file(str(DATA / "llama3_tokenizer" / "tokenizer.json"))
    ref.normalizer = normalizers.NFC()
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    ref.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    ref.add_tokens([AddedToken("e\u0301x", normalized=True, special=False)])
    path = tmp_path / "qwen2" / "tokenizer.json"
    path.parent.mkdir()
    ref.save(str(path))
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["normalizer"] == {"type": "NFC"}
    # The file holds the token decomposed, as given; both match it by its NFC form.
    assert doc["added_tokens"][-1]["content"] == "e\u0301x"
    texts = SAMPLES + LONG_TEXTS + STRESS + NFC_TEXTS + random_nfc_texts(500, seed=12)
    want = [ref.encode(t).ids for t in texts]
    assert_same(symprune_ids(path, texts, tmp_path), want, texts)
    # The normalized added token is found in decomposed and composed text alike.
    assert ref.encode("e\u0301x").ids == ref.encode("\u00e9x").ids == [doc["added_tokens"][-1]["id"]]


GPT2_VOCAB = DATA / "gpt2_tokenizer" / "vocab.json"
GPT2_MERGES = DATA / "gpt2_tokenizer" / "merges.txt"


def test_gpt2_vocab_merges_matches_transformers(tmp_path):
    from transformers import GPT2TokenizerFast

    ref = GPT2TokenizerFast(vocab_file=str(GPT2_VOCAB), merges_file=str(GPT2_MERGES))
    texts = SAMPLES + LONG_TEXTS + STRESS
    want = [ref(t)["input_ids"] for t in texts]
    assert_same(symprune_ids(GPT2_VOCAB, texts, tmp_path), want, texts)
    # Plain GPT-2 has no BOS in HF: asking for one adds nothing.
    assert_same(symprune_ids(GPT2_VOCAB.parent, texts[:3], tmp_path, bos=True), want[:3], texts[:3])
    assert ref("<|endoftext|>")["input_ids"] == [50256]


@pytest.mark.parametrize("variant", ["gpt2_fast", "byte_level_bpe", "byte_level_bpe_prefix_space", "pair_merges"])
def test_gpt2_tokenizer_json_matches_tokenizers(tmp_path, variant):
    from tokenizers import ByteLevelBPETokenizer, Tokenizer
    from transformers import GPT2TokenizerFast

    path = tmp_path / variant / "tokenizer.json"
    path.parent.mkdir()
    if variant in ("gpt2_fast", "pair_merges"):
        GPT2TokenizerFast(vocab_file=str(GPT2_VOCAB), merges_file=str(GPT2_MERGES)).backend_tokenizer.save(str(path))
    else:
        ByteLevelBPETokenizer(str(GPT2_VOCAB), str(GPT2_MERGES),
                              add_prefix_space=variant.endswith("prefix_space")).save(str(path))
    ref = Tokenizer.from_file(str(path))
    if variant == "pair_merges":  # newer tokenizers write merges as [a, b] pairs
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc["model"]["merges"] = [m.split(" ") for m in doc["model"]["merges"]]
        path.write_text(json.dumps(doc), encoding="utf-8")
    texts = SAMPLES + LONG_TEXTS + STRESS
    assert_same(symprune_ids(path, texts, tmp_path), [ref.encode(t).ids for t in texts], texts)


def test_opt_style_config_prepends_eos_as_bos(tmp_path):
    """OPT: GPT-2 merges with a tokenizer_config.json whose bos_token is </s>; HF prepends it."""
    from transformers import GPT2TokenizerFast

    vocab = json.loads(GPT2_VOCAB.read_text(encoding="utf-8"))
    d = tmp_path / "opt"
    d.mkdir()
    (d / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (d / "merges.txt").write_bytes(GPT2_MERGES.read_bytes())
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>",
         "add_bos_token": True}), encoding="utf-8")
    ref = GPT2TokenizerFast.from_pretrained(str(d))
    texts = ["Hello world", "a</s>b", " two  spaces", "<pad>x"]
    want = [ref(t)["input_ids"] for t in texts]
    assert want[0][0] == ref.convert_tokens_to_ids("</s>") == 50257
    assert_same(symprune_ids(d, texts, tmp_path, bos=True), want, texts)


# ---- llama2.c tokenizer.bin ----------------------------------------------------------------------


def read_llama2c(path):
    data = path.read_bytes()
    (max_len,) = struct.unpack_from("<i", data, 0)
    off, vocab, scores = 4, [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        vocab.append(data[off:off + n])
        scores.append(score)
        off += n
    return vocab, scores


def llama2c_encode(vocab, scores, text, bos):
    """Line-by-line port of karpathy/llama2.c run.c encode() (O(n^2) merging, as there)."""
    lookup = {}
    for i, piece in enumerate(vocab):
        lookup.setdefault(piece, i)
    raw = text.encode("utf-8")
    tokens = [1] if bos else []
    if raw:
        tokens.append(lookup[b" "])
    buf = b""
    for i, c in enumerate(raw):
        if c & 0xC0 != 0x80:
            buf = b""
        buf += bytes([c])
        if i + 1 < len(raw) and raw[i + 1] & 0xC0 == 0x80 and len(buf) < 4:
            continue
        if buf in lookup:
            tokens.append(lookup[buf])
        else:
            tokens.extend(b + 3 for b in buf)
        buf = b""
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for i in range(len(tokens) - 1):
            tid = lookup.get(vocab[tokens[i]] + vocab[tokens[i + 1]], -1)
            if tid != -1 and scores[tid] > best_score:
                best_score, best_id, best_idx = scores[tid], tid, i
        if best_idx == -1:
            break
        tokens[best_idx] = best_id
        del tokens[best_idx + 1]
    return tokens


@pytest.mark.parametrize("name", ["stories260K/tok512.bin", "llama2c_tokenizer/tokenizer.bin"])
def test_llama2c_tokenizer_bin_matches_run_c_port(tmp_path, name):
    path = DATA / name
    vocab, scores = read_llama2c(path)
    # The O(n^2) reference is slow in Python: the samples plus a few KB of each corpus.
    texts = SAMPLES + [head(TINYSTORIES, 3000), head(WIKITEXT, 2000)]
    assert_same(symprune_ids(path, texts, tmp_path, bos=True),
                [llama2c_encode(vocab, scores, t, True) for t in texts], texts)
    assert_same(symprune_ids(path, texts[:4], tmp_path), [llama2c_encode(vocab, scores, t, False) for t in texts[:4]],
                texts[:4])


def test_llama2c_reference_encoding_tok512(tmp_path):
    ids = symprune_ids(DATA / "stories260K" / "tok512.bin",
                       ["Once upon a time, there was a little girl named Lily."], tmp_path, bos=True)
    assert ids == [[1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426]]


def test_llama2_tokenizer_bin_agrees_with_sentencepiece_on_plain_text(tmp_path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(DATA / "llama2c_tokenizer" / "tokenizer.model"))
    texts = [t for t in SAMPLES if t.strip() and "\r" not in t] + LONG_TEXTS
    ours = symprune_ids(DATA / "llama2c_tokenizer" / "tokenizer.bin", texts, tmp_path, bos=True)
    assert_same(ours, [[1] + sp.encode(t) for t in texts], texts)


def test_cli_count_and_text_output(tmp_path):
    model = DATA / "llama2c_tokenizer" / "tokenizer.model"
    out = subprocess.run([BIN, "tokenize", "--tokenizer", str(model), "--text", "Hello world"],
                         check=True, capture_output=True, text=True).stdout
    assert out == "1,15043,3186\n"
    out = subprocess.run([BIN, "tokenize", "--tokenizer", str(model), "--text", "Hello world", "--no-bos", "--json"],
                         check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == [15043, 3186]
    out = subprocess.run([BIN, "tokenize", "--tokenizer", str(DATA / "llama2c_tokenizer"), "--text-file",
                          str(WIKITEXT), "--count"], check=True, capture_output=True, text=True).stdout
    assert out == "341469\n"
    out = subprocess.run([BIN, "tokenize", "--tokenizer", str(DATA / "gpt2_tokenizer"), "--text-file", str(WIKITEXT),
                          "--count", "--no-bos"], check=True, capture_output=True, text=True).stdout
    assert out == "287644\n"
    # --count with --texts-json: one count per text (it used to print the ids).
    batch = tmp_path / "texts.json"
    batch.write_text(json.dumps(["Once upon a time", ""]))
    out = subprocess.run([BIN, "tokenize", "--tokenizer", str(DATA / "stories260K" / "tok512.bin"), "--texts-json",
                          str(batch), "--count"], check=True, capture_output=True, text=True).stdout
    single = subprocess.run([BIN, "tokenize", "--tokenizer", str(DATA / "stories260K" / "tok512.bin"), "--text",
                             "Once upon a time", "--count"], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == [int(single), 1]


def test_cli_errors(tmp_path):
    r = subprocess.run([BIN, "tokenize", "--tokenizer", str(tmp_path), "--text", "x"], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"no tokenizer found in directory {tmp_path}" in r.stderr
    assert "tokenizer.model, tokenizer.json, vocab.json + merges.txt, tokenizer.bin" in r.stderr
    r = subprocess.run([BIN, "tokenize", "--tokenizer", str(DATA / "stories260K" / "tok512.bin")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "exactly one of --text, --text-file or --texts-json" in r.stderr
    missing = tmp_path / "nope.txt"
    r = subprocess.run([BIN, "tokenize", "--tokenizer", str(DATA / "stories260K" / "tok512.bin"), "--text-file",
                        str(missing)], capture_output=True, text=True)
    assert r.returncode == 1 and f"{missing}: text file (--text-file) not found" in r.stderr
