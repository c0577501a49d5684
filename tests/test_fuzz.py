"""A seeded, time-bounded fuzz pass over what a user hands the tool: request files,
config.json, checkpoint folders and chat templates. Every outcome must be a success (exit 0) or
one `error:` line with exit 2; anything else (a traceback, another exit code, a second line) is
collected with the input that caused it and fails the test.

Seeded (QWEN38_FUZZ_SEED, default 40) and bounded in time per surface (QWEN38_FUZZ_SECONDS,
default 15); the cases tried are printed (pytest -s shows them)."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import time
import traceback

import pytest

import cli
from qwen38gen.config import PRESETS

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("QWEN38_FUZZ_SEED", "40"))
SECONDS = float(os.environ.get("QWEN38_FUZZ_SECONDS", "15"))


@pytest.fixture(autouse=True)
def bounded_memory():
    """A case that would take the machine's memory is a MemoryError here (a finding), not the
    out-of-memory killer's business."""
    import resource

    old = resource.getrlimit(resource.RLIMIT_AS)
    limit = 8 << 30
    if old[0] == resource.RLIM_INFINITY or old[0] > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


CASE_SECONDS = 30   # one input that runs longer is a finding (a hang), not a slow test


class TooSlow(BaseException):   # not caught by an `except Exception` under test
    pass


def _too_slow(signum, frame):
    raise TooSlow(f"over {CASE_SECONDS} s")


def outcome(capsys, args) -> tuple[int, str, str] | str:
    """(exit code, stdout, stderr), or the traceback of an exception that escaped main."""
    import signal

    old = signal.signal(signal.SIGALRM, _too_slow)
    signal.alarm(CASE_SECONDS)
    try:
        cli.main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    except BaseException:   # noqa: B902 - a finding, not a test error
        capsys.readouterr()
        return traceback.format_exc(limit=-3)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    o = capsys.readouterr()
    return code, o.out, o.err


def judge(res) -> str | None:
    """None where the outcome is allowed, else what is wrong with it."""
    if isinstance(res, str):
        return "escaped: " + res.strip().splitlines()[-1]
    code, out, err = res
    if "Traceback" in out + err:
        return "traceback: " + err.strip().splitlines()[-1]
    if code == 0:
        return None
    lines = [x for x in err.splitlines() if x.strip()]
    if code != 2:
        return f"exit {code}: {err.strip()[-300:]}"
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return f"not one error line: {err.strip()[-300:]}"
    return None


class Pass:
    """Runs cases until the time is up; keeps the failures with their inputs."""

    def __init__(self, name):
        self.name, self.rng = name, random.Random(f"{SEED}-{name}")
        self.tried, self.ok, self.errors, self.failures = 0, 0, 0, []
        self.end = time.monotonic() + SECONDS

    def more(self) -> bool:
        return time.monotonic() < self.end

    def check(self, capsys, args, what):
        res = outcome(capsys, args)
        self.tried += 1
        bad = judge(res)
        if bad is None:
            self.ok += res[0] == 0
            self.errors += res[0] == 2
        else:
            self.failures.append((what, bad))

    def report(self):
        print(f"\nfuzz {self.name}: {self.tried} inputs, {self.ok} ran, {self.errors} one-line "
              f"errors, {len(self.failures)} failures")
        for what, bad in self.failures[:20]:
            print(f"  {what[:300]!r}\n    -> {bad}")
        assert self.tried > 0
        assert not self.failures, f"{len(self.failures)} failures, first: {self.failures[0]}"


# ------------------------------------------------------------------------------- values
def weird_value(rng: random.Random, depth=0):
    choices = [
        lambda: None, lambda: True, lambda: False, lambda: 0, lambda: -1, lambda: 1,
        lambda: rng.randint(-2**70, 2**70), lambda: 10 ** rng.randint(1, 30),
        lambda: rng.uniform(-1e6, 1e6), lambda: rng.choice([1e308, -1e308, 1e-320, 0.5, 3.4e38]),
        lambda: "", lambda: "x" * rng.randint(1, 50), lambda: "１２", lambda: "\udcff"[:0] + "é",
        lambda: "-1", lambda: "nan",
    ]
    if depth < 2:
        choices += [lambda: [weird_value(rng, depth + 1) for _ in range(rng.randint(0, 4))],
                    lambda: {rng.choice(["a", "id", "format", "weights", "num_bits"]):
                             weird_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}]
    return rng.choice(choices)()


def mutate_json_text(rng, text: str) -> bytes:
    b = bytearray(text.encode())
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            del b[i:i + rng.randint(1, 8)]
        elif op == 1:
            b[i:i] = rng.choice([b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"\xff", b"\x00",
                                 b"1e999", b"NaN", b"-", b"\n"])
        elif op == 2 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op == 3:
            b = b[:i]
        else:
            b[i:i] = b"[" * rng.randint(1, 3000)
    return bytes(b)


# ------------------------------------------------------------------------- the surfaces
REQUEST_FIELDS = ("id", "prompt", "prompt_ids", "max_tokens", "temperature", "top_k", "top_p",
                  "min_p", "seed", "stop_token_ids", "ignore_eos")


def request_line(rng) -> bytes:
    r = {"id": rng.randrange(1000), "prompt_ids": [rng.randrange(1024) for _ in range(3)],
         "max_tokens": 2}
    for _ in range(rng.randint(0, 4)):
        r[rng.choice(REQUEST_FIELDS + ("bogus",))] = weird_value(rng)
    text = json.dumps(r)
    return mutate_json_text(rng, text) if rng.random() < 0.3 else text.encode()


def test_fuzz_request_files(capsys, tmp_path):
    p = Pass("request files")
    f = tmp_path / "r.jsonl"
    while p.more():
        lines = [request_line(p.rng) for _ in range(p.rng.randint(1, 4))]
        f.write_bytes(b"\n".join(lines) + b"\n")
        p.check(capsys, ["run", "--backend", "reference", "--model", "tiny", "--batch", "2",
                         "--ctx", "16", "--prompts", f], b" | ".join(lines).decode("latin-1"))
    p.report()


def test_fuzz_config_json(capsys, tmp_path):
    p = Pass("config.json")
    base = PRESETS["tiny"].to_hf_dict()
    d = tmp_path / "m"
    d.mkdir()
    while p.more():
        raw = json.loads(json.dumps(base))
        target = raw
        if p.rng.random() < 0.2:
            raw = {"text_config": raw, "model_type": "qwen3_5"}
        for _ in range(p.rng.randint(1, 3)):
            k = p.rng.choice(list(target) + ["quantization_config", "layer_types", "bogus"])
            if p.rng.random() < 0.2:
                target.pop(k, None)
            else:
                target[k] = weird_value(p.rng)
        text = json.dumps(raw)
        data = mutate_json_text(p.rng, text) if p.rng.random() < 0.2 else text.encode()
        (d / "config.json").write_bytes(data)
        what = data.decode("latin-1")
        p.check(capsys, ["info", d], "info: " + what)
        p.check(capsys, ["emit", "--batch", "2", "--model", d, "-o", tmp_path / "x.cu"],
                "emit: " + what)
    p.report()


def test_fuzz_checkpoint_folders(capsys, tmp_path):
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights
    from tests.test_file_modes import SMALL

    p = Pass("checkpoint folders")
    good = tmp_path / "good"
    save_checkpoint(SMALL, synthetic_weights(SMALL, 1), good, max_shard_bytes=200_000)
    shards = sorted(x.name for x in good.iterdir() if x.suffix == ".safetensors")
    d = tmp_path / "ck"
    while p.more():
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(tmp_path / "q", ignore_errors=True)
        shutil.copytree(good, d)
        what = []
        for _ in range(p.rng.randint(1, 2)):
            op = p.rng.randrange(6)
            s = d / p.rng.choice(shards)
            if op == 0:
                s.unlink(missing_ok=True)
                what.append(f"rm {s.name}")
            elif op == 1 and s.exists():
                b = s.read_bytes()
                s.write_bytes(b[:p.rng.randrange(len(b))])
                what.append(f"truncate {s.name}")
            elif op == 2 and s.exists():   # the header: 8-byte length, then JSON
                b = bytearray(s.read_bytes())
                n = struct.unpack("<Q", b[:8])[0]
                i = p.rng.randrange(8 + n)
                b[i] = p.rng.randrange(256)
                s.write_bytes(bytes(b))
                what.append(f"header byte {i} of {s.name}")
            elif op == 3:
                idx = d / "model.safetensors.index.json"
                try:
                    raw = json.loads(idx.read_text())
                except ValueError:   # mangled by an earlier mutation of this case
                    continue
                k = p.rng.choice(list(raw["weight_map"]))
                raw["weight_map"][k] = weird_value(p.rng)
                idx.write_text(json.dumps(raw))
                what.append(f"weight_map[{k}] = {raw['weight_map'][k]!r}")
            elif op == 4:
                idx = d / "model.safetensors.index.json"
                idx.write_bytes(mutate_json_text(p.rng, idx.read_bytes().decode("latin-1")))
                what.append("index bytes")
            else:
                (d / "config.json").write_text(json.dumps(weird_value(p.rng)))
                what.append("config.json")
        p.check(capsys, ["quantize", d, "-o", tmp_path / "q"], "quantize: " + "; ".join(what))
        p.check(capsys, ["generate", "--weights", d, "--steps", "1"],
                "generate: " + "; ".join(what))
    p.report()


TEMPLATE_PIECES = [
    "{{ messages[0]['content'] }}", "{{ messages[0].content }}", "{% for m in messages %}",
    "{% endfor %}", "{% if add_generation_prompt %}", "{% endif %}", "{{ bos_token }}",
    "{{ raise_exception('no') }}", "{{ 1/0 }}", "{{ 'a' + 1 }}", "{{ x.y.z }}",
    "{{ ''.__class__ }}", "{{ range(10**6) | list | length }}", "{{ 'x' * 999999999 }}",
    "{% include 'a' %}", "{% import 'a' as b %}", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{{ messages | tojson }}", "{{ strftime_now('%Y') }}", "{% set n = namespace(a=1) %}",
    "{{ 2 ** 100000 }}", "{{", "}}", "{%", "%}", "{# c #}", "\xff", "text", "{% break %}",
    "{{ messages[99] }}", "{{ enable_thinking | int }}", "{{ (messages * 10**7) | length }}",
]


def test_fuzz_chat_templates(capsys, tmp_path):
    pytest.importorskip("tokenizers")
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights
    from tests.test_text_run import CFG
    from tests.test_tokenizer import small_model_dir

    p = Pass("chat templates")
    d = tmp_path / "m"
    save_checkpoint(CFG, synthetic_weights(CFG, 2), d)
    small_model_dir(d, template_in="jinja")
    while p.more():
        t = "".join(p.rng.choice(TEMPLATE_PIECES) for _ in range(p.rng.randint(1, 5)))
        data = t.encode("utf-8", "surrogateescape") if p.rng.random() < 0.9 else \
            mutate_json_text(p.rng, t)
        (d / "chat_template.jinja").write_bytes(data)
        p.check(capsys, ["generate", "--model", d, "--chat", "--prompt", "hello", "--steps", "0"],
                data.decode("latin-1"))
    p.report()
