"""Forward parity: `symprune logits` on tiny random transformers models (LLaMA MHA/GQA, plain RoPE,
llama3-, linear- and dynamic-scaled RoPE; Mistral with its sliding window; Qwen2 with its q/k/v biases; OPT pre-/post-LN,
with and without project_in/out), saved in fp32, bf16 and fp16, against transformers' own fp32 logits
on the same (rounded) weights: max |diff| / max |ref| <= 1e-4."""
import os
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, OPTConfig,
                          OPTForCausalLM, Qwen2Config, Qwen2ForCausalLM)

BIN = os.environ.get("SYMPRUNE_BIN", "symprune")
TOL = 1e-4
VOCAB = 96

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}
# A factor that is not a power of two, so that the division rounds.
LINEAR_SCALING = {"type": "linear", "factor": 2.5}
DYNAMIC_SCALING = {"rope_type": "dynamic", "factor": 4.0}


def llama(heads, kv_heads, theta, scaling, tied=False):
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, rope_theta=theta,
                       rope_scaling=scaling, max_position_embeddings=1024, rms_norm_eps=1e-5,
                       tie_word_embeddings=tied, initializer_range=0.1, bos_token_id=1, eos_token_id=2)


SEQ_LEN = 150  # the parity test's sequence length


def mistral(window):
    # A window of exactly the test's length: the longest sequence symprune computes (full causal attention
    # equals the windowed one there).
    return MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0, sliding_window=window,
                         max_position_embeddings=1024, rms_norm_eps=1e-5, initializer_range=0.1)


def qwen2(tied):
    return Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, rope_theta=1000000.0,
                       max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=tied,
                       initializer_range=0.1, use_sliding_window=False, sliding_window=16)


def opt(pre_ln, proj_dim):
    return OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                     max_position_embeddings=512, word_embed_proj_dim=proj_dim, do_layer_norm_before=pre_ln,
                     init_std=0.1, bos_token_id=2, eos_token_id=2, pad_token_id=1)


CONFIGS = {
    "llama-mha-theta1e4": (LlamaForCausalLM, lambda: llama(4, 4, 10000.0, None)),
    "llama-gqa-theta1e4-tied": (LlamaForCausalLM, lambda: llama(8, 2, 10000.0, None, tied=True)),
    "llama-mha-theta5e5-llama3": (LlamaForCausalLM, lambda: llama(4, 4, 500000.0, LLAMA3_SCALING)),
    "llama-gqa-theta5e5-llama3": (LlamaForCausalLM, lambda: llama(8, 2, 500000.0, LLAMA3_SCALING)),
    "llama-gqa-linear": (LlamaForCausalLM, lambda: llama(8, 2, 10000.0, LINEAR_SCALING)),
    "llama-mha-dynamic": (LlamaForCausalLM, lambda: llama(4, 4, 10000.0, DYNAMIC_SCALING)),
    "mistral-gqa-window": (MistralForCausalLM, lambda: mistral(SEQ_LEN)),
    "mistral-gqa-no-window": (MistralForCausalLM, lambda: mistral(None)),
    "qwen2-gqa-bias": (Qwen2ForCausalLM, lambda: qwen2(False)),
    "qwen2-gqa-bias-tied": (Qwen2ForCausalLM, lambda: qwen2(True)),
    "opt-preln": (OPTForCausalLM, lambda: opt(True, 64)),
    "opt-preln-project": (OPTForCausalLM, lambda: opt(True, 32)),
    "opt-postln": (OPTForCausalLM, lambda: opt(False, 64)),
    "opt-postln-project": (OPTForCausalLM, lambda: opt(False, 32)),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_model(name, dtype_name, out_dir):
    cls, make_config = CONFIGS[name]
    torch.manual_seed(zlib.crc32(f"{name}/{dtype_name}".encode()))
    model = cls(make_config()).eval()
    # Give the norms non-trivial parameters so their handling is tested too.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(0.1 * torch.randn_like(p))
            if pname.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    model = model.to(DTYPES[dtype_name])
    model.save_pretrained(out_dir, safe_serialization=True)
    # Reference: the same rounded weights in a fresh fp32 model (model.to(fp32) would keep the RoPE
    # inv_freq buffer rounded to 16 bits, which transformers itself recomputes in fp32 when loading).
    reference = cls(make_config()).eval()
    reference.load_state_dict({k: v.to(torch.float32) for k, v in model.state_dict().items()})
    return reference


def symprune_logits(model_dir, ids, out):
    proc = subprocess.run([BIN, "logits", "--model", str(model_dir), "--ids", ",".join(map(str, ids)),
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(name, dtype_name, tmp_path):
    model_dir = tmp_path / "model"
    ref_model = make_model(name, dtype_name, model_dir)
    # Long enough that positions beyond original_max_position_embeddings (64) are exercised.
    seq_len = SEQ_LEN
    ids = torch.randint(0, VOCAB, (seq_len,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
    got = symprune_logits(model_dir, ids, tmp_path / "logits.f32").astype(np.float64)
    assert got.shape == ref.shape
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel <= TOL, f"{name} {dtype_name}: relative max error {rel:.3e}"


@pytest.mark.parametrize("theta,scaling,changes", [(500000.0, LLAMA3_SCALING, True),
                                                    (10000.0, LINEAR_SCALING, True),
                                                    (10000.0, DYNAMIC_SCALING, False)],
                         ids=["llama3", "linear", "dynamic"])
def test_rope_scaling_changes_logits_where_it_should(tmp_path, theta, scaling, changes):
    """Guards the parity cases above: llama3 and linear scaling move the logits at this length; dynamic (NTK)
    scaling leaves them as they are on every sequence up to max_position_embeddings, the longest symprune
    accepts."""
    torch.manual_seed(3)
    base = LlamaForCausalLM(llama(4, 4, theta, None)).eval()
    scaled = LlamaForCausalLM(llama(4, 4, theta, scaling)).eval()
    scaled.load_state_dict(base.state_dict())
    scaled.save_pretrained(tmp_path / "scaled", safe_serialization=True)
    ids = list(range(1, 91))
    with torch.no_grad():
        a = base(torch.tensor([ids])).logits[0].numpy()
        b = scaled(torch.tensor([ids])).logits[0].numpy()
    assert (np.abs(a - b).max() / np.abs(a).max() > 1e-3) == changes
    got = symprune_logits(tmp_path / "scaled", ids, tmp_path / "l.f32")
    assert np.abs(got - b).max() / np.abs(b).max() <= TOL


def test_mistral_window_is_the_longest_sequence(tmp_path):
    """Past the sliding window transformers' Mistral attends to fewer tokens than a full causal attention;
    symprune computes the latter, so a longer sequence is refused, naming the window. Qwen2 with
    use_sliding_window in its upper layers is bounded the same way."""
    window = 12
    torch.manual_seed(4)
    windowed = MistralForCausalLM(mistral(window)).eval()
    full = MistralForCausalLM(mistral(None)).eval()
    full.load_state_dict(windowed.state_dict())
    windowed.save_pretrained(tmp_path / "windowed", safe_serialization=True)
    ids = list(range(1, window + 2))
    with torch.no_grad():
        a = windowed(torch.tensor([ids])).logits[0].numpy()
        b = full(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(a[:window] - b[:window]).max() <= 1e-6 * np.abs(b).max()
    assert np.abs(a[window] - b[window]).max() > 1e-3 * np.abs(b).max()
    got = symprune_logits(tmp_path / "windowed", ids[:window], tmp_path / "l.f32")
    assert np.abs(got - a[:window]).max() / np.abs(a).max() <= TOL
    proc = subprocess.run([BIN, "logits", "--model", str(tmp_path / "windowed"), "--ids",
                           ",".join(map(str, ids)), "--out", str(tmp_path / "o.f32")], capture_output=True, text=True)
    assert proc.returncode == 1
    config_json = tmp_path / "windowed" / "config.json"
    assert f"{config_json}: sequence length {window + 1} exceeds sliding_window {window}" in proc.stderr
    assert not (tmp_path / "o.f32").exists()

    qwen = qwen2(False)
    qwen.use_sliding_window, qwen.sliding_window, qwen.max_window_layers = True, window, 1
    Qwen2ForCausalLM(qwen).save_pretrained(tmp_path / "qwen", safe_serialization=True)
    proc = subprocess.run([BIN, "logits", "--model", str(tmp_path / "qwen"), "--ids", ",".join(map(str, ids)),
                           "--out", str(tmp_path / "o.f32")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"sequence length {window + 1} exceeds sliding_window {window}" in proc.stderr
    # Every layer below max_window_layers attends fully: no bound.
    qwen.max_window_layers = 2
    Qwen2ForCausalLM(qwen).save_pretrained(tmp_path / "qwen-full", safe_serialization=True)
    symprune_logits(tmp_path / "qwen-full", ids, tmp_path / "l.f32")


def test_logits_errors(tmp_path):
    model_dir = tmp_path / "model"
    make_model("llama-mha-theta1e4", "float32", model_dir)
    proc = subprocess.run([BIN, "logits", "--model", str(model_dir), "--ids", "1,x,3", "--out",
                           str(tmp_path / "o.f32")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "--ids: '1,x,3' is not a comma-separated list of token ids (bad item 'x')" in proc.stderr
    proc = subprocess.run([BIN, "logits", "--model", str(model_dir), "--ids", f"1,{VOCAB}", "--out",
                           str(tmp_path / "o.f32")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"token id {VOCAB} at position 1 outside the vocabulary [0, {VOCAB}) of {model_dir}" in proc.stderr
    assert not (tmp_path / "o.f32").exists()
    too_long = ",".join(["1"] * 1025)
    proc = subprocess.run([BIN, "logits", "--model", str(model_dir), "--ids", too_long, "--out",
                           str(tmp_path / "o.f32")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{model_dir / 'config.json'}: sequence length 1025 exceeds max_position_embeddings 1024" in proc.stderr


def test_stories260k_matches_llama2c_reference(tmp_path):
    """A real trained GQA LLaMA: converted from llama2.c, our logits match karpathy's run.c."""
    data = os.environ.get("SYMPRUNE_DATA")
    if not data:
        pytest.skip("SYMPRUNE_DATA not set")
    data = Path(data) / "stories260K"
    model_dir = tmp_path / "stories260K"
    proc = subprocess.run([BIN, "convert-llama2c", "--checkpoint", str(data / "stories260K.bin"), "--tokenizer",
                           str(data / "tok512.bin"), "--out", str(model_dir)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ids = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426]
    ref = np.fromfile(data / "reference" / "logits_once_upon_a_time_lily.f32", dtype="<f4").reshape(16, 512)
    got = symprune_logits(model_dir, ids, tmp_path / "l.f32")
    assert np.abs(got - ref).max() / np.abs(ref).max() <= TOL
    # Greedy next tokens equal the prompt's continuation, as in the reference.
    assert got.argmax(axis=1)[:-1].tolist() == ids[1:]
