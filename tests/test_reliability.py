"""Issue 40 (Reliability II) as a user meets it: nothing a user points the tool at is destroyed,
every failure is one `error:` line with exit 2, every interruption leaves nothing behind.

Most run the command line in this process (cli.main); signals, closed streams and read-only
folders need a subprocess."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_bad_input import ROOT, assert_user_error, invoke, readonly_dir, run_cli  # noqa: F401

PY = sys.executable


def names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def requests(path: Path, n: int = 1, max_tokens: int = 2) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt_ids": [1, 2, 3],
                                        "max_tokens": max_tokens}) + "\n" for i in range(n)))
    return path


def run_args(*args):
    return ("run", "--backend", "reference", "--model", "tiny", "--batch", "2", *args)


def fake_checkpoint(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}\n")
    (d / "model.safetensors").write_bytes(b"weights")
    return d


# ------------------------------------------------------------------ item 1: quantize's source
@pytest.mark.parametrize("out", ["par", "par/src", "par/src/q", "link", "link/q"])
def test_quantize_never_writes_over_or_around_its_source(capsys, tmp_path, monkeypatch, out):
    """`quantize par/src -o par --overwrite` deleted the source; a symlink to it as -o replaced
    it; -o inside it would be deleted with it."""
    src = fake_checkpoint(tmp_path / "par" / "src")
    os.symlink(src, tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    assert_user_error(*invoke(capsys, "quantize", "par/src", "-o", out, "--overwrite"),
                      r"output folder '.*' (is|contains|lies inside) the source folder")
    assert names(src) == ["config.json", "model.safetensors"] and names(tmp_path / "par") == ["src"]


def test_quantize_dot_onto_its_own_path_is_one_line(capsys, tmp_path, monkeypatch):
    src = fake_checkpoint(tmp_path / "src")
    monkeypatch.chdir(src)
    assert_user_error(*invoke(capsys, "quantize", ".", "-o", "../src", "--overwrite"),
                      r"output folder '\.\./src' is the source folder '\.'")
    assert names(src) == ["config.json", "model.safetensors"]


# ------------------------------------------------------- item 2: run's outputs, before the run
def test_run_output_or_json_equal_to_the_requests_is_refused(capsys, tmp_path):
    req = requests(tmp_path / "r.jsonl")
    before = req.read_text()
    for opt in ("--output", "--json"):
        assert_user_error(*invoke(capsys, *run_args("--prompts", req, opt, req)),
                          rf"{opt} '.*r\.jsonl' is the input --prompts")
    os.symlink(req, tmp_path / "alias")
    assert_user_error(*invoke(capsys, *run_args("--prompts", req, "--output", tmp_path / "alias")),
                      r"is the input --prompts")
    assert req.read_text() == before and names(tmp_path) == ["alias", "r.jsonl"]


def test_run_json_equal_to_output_is_refused(capsys, tmp_path):
    req = requests(tmp_path / "r.jsonl")
    o = tmp_path / "o.jsonl"
    assert_user_error(*invoke(capsys, *run_args("--prompts", req, "--output", o, "--json", o)),
                      r"--json '.*o\.jsonl' is also --output")
    assert names(tmp_path) == ["r.jsonl"]


def test_run_writes_a_fifo_in_place(capsys, tmp_path):
    req = requests(tmp_path / "r.jsonl", n=2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    rc, out, err = invoke(capsys, *run_args("--prompts", req, "--output", fifo))
    reader.join(10)
    if reader.is_alive():   # the run never opened the FIFO: let the reader see an end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert rc == 0, err
    assert sorted(json.loads(x)["id"] for x in got[0].splitlines()) == [0, 1]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and names(tmp_path) == ["fifo", "r.jsonl"]


def null_device(tmp_path) -> Path:
    """A null device of the test's own (as root, mknod): code that replaces its target must not
    take the machine's /dev/null with it. Unprivileged, /dev/null itself: /dev is not writable."""
    if os.geteuid() != 0:
        return Path("/dev/null")
    p = tmp_path / "null"
    os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return p


def test_run_onto_dev_null_leaves_the_device(capsys, tmp_path):
    req = requests(tmp_path / "r.jsonl")
    null = null_device(tmp_path)
    rc, out, err = invoke(capsys, *run_args("--prompts", req, "--output", null, "--json", null))
    assert rc == 0, err
    assert stat.S_ISCHR(os.stat(null).st_mode)


# ------------------------------------------- item 3: an unwritable target, found before the run
@pytest.mark.parametrize("opt", ["--output", "--json"])
@pytest.mark.parametrize("where,pattern", [
    ("folder", r"cannot write '.*/folder': it is a folder; give a file name"),
    ("file/x", r"cannot write '.*/file/x': '.*/file' is a file, not a folder"),
])
def test_run_target_that_cannot_be_written_fails_before_the_run(capsys, tmp_path, opt, where,
                                                                pattern):
    req = requests(tmp_path / "r.jsonl")
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("keep\n")
    rc, out, err = invoke(capsys, *run_args("--prompts", req, opt, tmp_path / where))
    assert_user_error(rc, out, err, pattern)
    assert "Throughput" not in err and names(tmp_path) == ["file", "folder", "r.jsonl"]
    assert names(tmp_path / "folder") == []


def test_run_into_a_readonly_folder_fails_before_the_run(readonly_dir, tmp_path):
    ro, prefix = readonly_dir
    req = requests(tmp_path / "r.jsonl")
    for opt in ("--output", "--json"):
        rc, out, err = run_cli(*run_args("--prompts", req, opt, ro / "o"), cwd=tmp_path,
                               prefix=prefix)
        assert_user_error(rc, out, err, r"cannot write '.*/ro/o': Permission denied")
        assert "Throughput" not in err and names(ro) == []


# ---------------------------------------------------------------------- item 5: the umask
@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_run_output_files_honour_the_umask(capsys, tmp_path, mask):
    req = requests(tmp_path / "r.jsonl")
    old = os.umask(mask)
    try:
        rc, _, err = invoke(capsys, *run_args("--prompts", req, "--output", tmp_path / "o",
                                              "--json", tmp_path / "s"))
    finally:
        os.umask(old)
    assert rc == 0, err
    for p in ("o", "s"):
        assert stat.S_IMODE(os.stat(tmp_path / p).st_mode) == 0o666 & ~mask


# --------------------------------------------------- item 4: signals leave nothing behind
def _start(args, cwd):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "COLUMNS": "200",
           "HOME": str(cwd), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen([PY, "-m", "cli", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(cond, proc, timeout=60):
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail(f"never happened; stderr: {proc.communicate()[1]}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                      (signal.SIGINT, 130)])
def test_a_signal_during_run_output_leaves_no_temp(tmp_path, sig, code):
    req = requests(tmp_path / "r.jsonl", n=1, max_tokens=500)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    p = _start(run_args("--prompts", req, "--ctx", 600, "--output", out_dir / "o.jsonl",
                        "--json", out_dir / "s.json"), tmp_path)
    _wait_for(lambda: len(names(out_dir)) == 2, p)   # both temp files: the run has begun
    time.sleep(0.3)
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == code, err
    assert err.strip() == f"interrupted by {signal.Signals(sig).name}; nothing was written"
    assert names(out_dir) == []


def test_quantize_interrupted_after_its_rename_says_the_output_is_complete(capsys, tmp_path,
                                                                           monkeypatch):
    """Not "aborted" over a complete output: the line says what was written."""
    import qwen38gen.quantize as Q
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    from .test_file_modes import SMALL

    save_checkpoint(SMALL, synthetic_weights(SMALL, 1), tmp_path / "hf")
    real = Q.quantize_checkpoint

    def then_signal(*a, **k):
        r = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return r

    monkeypatch.setattr(Q, "quantize_checkpoint", then_signal)
    rc, out, err = invoke(capsys, "quantize", tmp_path / "hf", "-o", tmp_path / "q4")
    assert rc == 143 and "aborted" not in err
    assert err.strip() == f"interrupted by SIGTERM after {str(tmp_path / 'q4')!r} was written completely"
    assert "quantization.json" in names(tmp_path / "q4") and names(tmp_path) == ["hf", "q4"]


FAKE_NVCC = """#!/bin/sh
case "$1" in --version) echo "Cuda compilation tools, release 13.0, V13.0.0"; exit 0;; esac
sleep 60 &
echo $! > "$PIDFILE"
wait
"""


def test_sigterm_during_gate_kills_nvcc_and_its_children_and_leaves_no_temp_folder(tmp_path):
    from qwen38gen.config import PRESETS
    from qwen38gen.emit import emit_program, write_program
    from qwen38gen.lanes import Lanes

    cu, _ = write_program(emit_program(PRESETS["tiny"], Lanes.make(2)), tmp_path / "p.cu")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text(FAKE_NVCC)
    (bin_dir / "nvcc").chmod(0o755)
    pidf, cache = tmp_path / "ptxas.pid", tmp_path / "cache"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "QWEN38_CACHE": str(cache), "PIDFILE": str(pidf), "HOME": str(tmp_path)}
    p = subprocess.Popen([PY, "-m", "cli", "gate", str(cu)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: pidf.exists() and pidf.read_text().strip(), p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    assert err.strip() == "interrupted by SIGTERM; nothing was written"
    assert names(cache / "gate") == []   # no temp folder, no failed-*.cu
    grandchild = int(pidf.read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("nvcc's child outlived the gate")


# -------------------------------------------- item 6: closed, full and broken standard output
def _shell(cmd: str, cwd) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(cwd)}
    return subprocess.run(["sh", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("redirect,pattern", [
    (">&-", r"cannot write to standard output: standard output is closed"),
    ("> /dev/full", r"cannot write to standard output: No space left on device"),
])
def test_a_closed_or_full_stdout_is_one_line(tmp_path, redirect, pattern):
    r = _shell(f"{PY} -m cli info tiny {redirect}", tmp_path)
    assert_user_error(r.returncode, "", r.stderr, pattern)


def test_a_closed_stdout_after_the_files_are_written_says_so(tmp_path):
    """emit writes its pair, then cannot print "wrote …": the files are whole, the line says why
    the exit is 2."""
    r = _shell(f"{PY} -m cli emit --batch 2 -o p.cu >&-", tmp_path)
    assert_user_error(r.returncode, "", r.stderr, r"standard output is closed")
    assert names(tmp_path) == ["p.cu", "p.manifest.json"]


def test_a_broken_pipe_is_one_line(tmp_path):
    read, write = os.pipe()
    os.close(read)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    p = subprocess.run([PY, "-m", "cli", "emit", "--batch", "2", "--stdout"], cwd=tmp_path,
                       env=env, stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    assert_user_error(p.returncode, "", p.stderr, r"cannot write to standard output: Broken pipe")


# ----------------------------------------------- item 8: prompt bytes that are not text, ''
@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    pytest.importorskip("tokenizers")
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights
    from tests.test_text_run import CFG
    from tests.test_tokenizer import small_model_dir

    d = tmp_path_factory.mktemp("rel") / "m"
    save_checkpoint(CFG, synthetic_weights(CFG, 2), d)
    return small_model_dir(d)


@pytest.mark.parametrize("cmd", ["generate", "run"])
def test_a_prompt_that_is_not_utf8_is_one_line(tmp_path, text_model, cmd):
    extra = ("--backend", "reference") if cmd == "run" else ("--steps", "1")
    # Python keeps undecodable argv bytes as lone surrogates; a subprocess passes the bytes.
    p = subprocess.run([PY.encode(), b"-m", b"cli", cmd.encode(), b"--model",
                        str(text_model).encode(), b"--prompt", b"ab\xff\xfe",
                        *(a.encode() for a in extra)], capture_output=True, cwd=tmp_path,
                       env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)})
    assert_user_error(p.returncode, "", p.stderr.decode(errors="replace"),
                      r"--prompt.*not valid UTF-8 \(byte 0xff at character 2\)")


def test_generate_an_empty_text_prompt_is_one_line(capsys, text_model):
    assert_user_error(*invoke(capsys, "generate", "--model", text_model, "--prompt", ""),
                      r"--prompt '' is empty; give some text")


# ----------------------------------------------------- item 7: chat templates that fail
@pytest.mark.parametrize("template,pattern", [
    ("{{ 1/0 }}", r"ZeroDivisionError"),
    ("{{ 'a' + 1 }}", r"TypeError"),
    ("{% include 'other.jinja' %}", r"fails while rendering"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", r"RecursionError"),
    ("{{ 'x' * 10**12 }}", r"exponent|repeat"),
    ("{{ 'x' * 1000000000000 }}", r"repeat of 1,000,000,000,000 items"),
    ("{% for i in range(99999) %}{{ 'y' * 1000 }}{% endfor %}",
     r"rendered prompt passes 16,777,216 characters"),
    ("{% for i in range(10**9) %}{% endfor %}", r"range too big|exponent|fails"),
])
def test_a_failing_chat_template_is_a_template_error_naming_the_file(tmp_path, template,
                                                                     pattern):
    pytest.importorskip("tokenizers")
    from qwen38gen.errors import UserError
    from qwen38gen.tokenizer import load_tokenizer
    from tests.test_tokenizer import small_model_dir

    d = small_model_dir(tmp_path / "m", template_in="jinja")
    (d / "chat_template.jinja").write_text(template)
    tok = load_tokenizer(d)
    with pytest.raises(UserError, match=r"chat template '.*/m/chat_template\.jinja'.*" + pattern):
        tok.render_chat([{"role": "user", "content": "hi"}])


def test_a_chat_template_whose_loops_print_nothing_is_bounded_in_time(tmp_path, monkeypatch):
    """Nested loops that write nothing pass no size bound: the render's deadline stops them."""
    pytest.importorskip("tokenizers")
    import time

    from qwen38gen import tokenizer as T
    from qwen38gen.errors import UserError
    from tests.test_tokenizer import small_model_dir

    monkeypatch.setattr(T, "MAX_RENDER_SECONDS", 0.5)
    d = small_model_dir(tmp_path / "m", template_in="jinja")
    (d / "chat_template.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    tok = T.load_tokenizer(d)
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"chat template '.*chat_template\.jinja': rendering took "
                                        r"over 0\.5 s; the template runs away"):
        tok.render_chat([{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < 5


def test_a_chat_template_that_is_not_utf8_is_named(tmp_path):
    pytest.importorskip("tokenizers")
    from qwen38gen.errors import UserError
    from qwen38gen.tokenizer import load_tokenizer
    from tests.test_tokenizer import small_model_dir

    d = small_model_dir(tmp_path / "m", template_in="jinja")
    (d / "chat_template.jinja").write_bytes(b"{{ 'a' }}\xff")
    with pytest.raises(UserError, match=r"chat template '.*chat_template\.jinja' is not UTF-8"):
        load_tokenizer(d)


# ------------------------------------------------------------ item 9: odd configs and lines
@pytest.mark.parametrize("group,pattern", [
    ("[]", r"quantization_config\.config_groups\.g is \[\]; only a JSON object"),
    ('{"format": "pack-quantized", "weights": 4}',
     r"config_groups\.g\.weights is 4; only a JSON object"),
])
def test_a_compressed_tensors_group_that_is_not_an_object(capsys, tmp_path, group, pattern):
    from qwen38gen.config import PRESETS

    raw = PRESETS["tiny"].to_hf_dict()
    raw["quantization_config"] = {"quant_method": "compressed-tensors",
                                  "config_groups": {"g": json.loads(group)}}
    d = tmp_path / "ct"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    assert_user_error(*invoke(capsys, "quantize", d, "-o", tmp_path / "q"), pattern)
    assert names(tmp_path) == ["ct"]


def test_an_unreadable_config_is_one_line(readonly_dir, tmp_path):
    ro, prefix = readonly_dir
    if prefix:   # root reads a file of mode 0 through CAP_DAC_READ_SEARCH too
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "config.json").chmod(0)
    try:
        rc, out, err = run_cli("info", tmp_path / "m", cwd=tmp_path, prefix=prefix)
    finally:
        (tmp_path / "m" / "config.json").chmod(0o644)
    assert_user_error(rc, out, err, r"config file '.*/m/config\.json' cannot be read: "
                                    r"Permission denied")


def test_a_config_that_is_a_device_is_not_said_missing(capsys):
    assert_user_error(*invoke(capsys, "info", "--model", "/dev/null"),
                      r"'/dev/null' is not a regular file")


@pytest.mark.parametrize("line,pattern", [
    ("[" * 100_000 + "]" * 100_000, r"line 1: not a request JSON can hold \(RecursionError"),
    ('{"prompt_ids": [' + "9" * 5000 + "]}", r"line 1: not a request JSON can hold"),
])
def test_a_request_line_json_cannot_hold(capsys, tmp_path, line, pattern):
    (tmp_path / "r.jsonl").write_text(line + "\n")
    assert_user_error(*invoke(capsys, *run_args("--prompts", tmp_path / "r.jsonl")), pattern)


def test_quantize_onto_an_empty_readonly_folder(readonly_dir, tmp_path):
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights
    from tests.test_file_modes import SMALL

    ro, prefix = readonly_dir
    save_checkpoint(SMALL, synthetic_weights(SMALL, 1), tmp_path / "hf")
    rc, out, err = run_cli("quantize", tmp_path / "hf", "-o", ro, cwd=tmp_path, prefix=prefix)
    assert_user_error(rc, out, err, r"cannot replace '.*/ro': Permission denied")
    assert names(tmp_path) == ["hf", "ro"] and names(ro) == []


# ------------------------------------------------------ item 10: what does nothing is refused
@pytest.mark.parametrize("opt", ["--max-tokens", "--temperature", "--top-k", "--top-p",
                                 "--min-p"])
def test_a_zero_sampling_option_with_prompts_is_refused(capsys, tmp_path, opt):
    req = requests(tmp_path / "r.jsonl")
    assert_user_error(*invoke(capsys, *run_args("--prompts", req, opt, "0")),
                      rf"{opt} goes with --prompt; in a --prompts file each line sets its own")


@pytest.mark.parametrize("args,pattern", [
    (("generate", "--think"), r"--think is the chat template's thinking mode; it needs --chat"),
    (("golden", "--candidate", "c.json"), r"--candidate is where --update also writes"),
    (("emit", "--batch", "2", "--stdout", "-o", "x.cu"), r"give --stdout .* or -o FILE\.cu"),
])
def test_an_option_that_would_do_nothing_is_refused(capsys, tmp_path, monkeypatch, args,
                                                    pattern):
    monkeypatch.chdir(tmp_path)
    assert_user_error(*invoke(capsys, *args), pattern)
    assert names(tmp_path) == []


@pytest.mark.parametrize("field,value", [("temperature", 1e308), ("top_p", 1e39),
                                         ("min_p", -1e300)])
def test_sampling_numbers_are_checked_in_float32(capsys, tmp_path, field, value):
    (tmp_path / "r.jsonl").write_text(json.dumps({"prompt_ids": [1], field: value}) + "\n")
    assert_user_error(*invoke(capsys, *run_args("--prompts", tmp_path / "r.jsonl")),
                      rf"line 1: {field} .* overflows float32")


# ------------------------------------------------------------------------ item 11: messages
@pytest.mark.parametrize("ids", ["1,,2", "1,2,", "１２", "²", "1 2"])
def test_prompt_ids_are_ascii_digits_and_no_empty_item(capsys, ids):
    assert_user_error(*invoke(capsys, "generate", "--prompt-ids", ids, "--steps", "1"),
                      r"--prompt-ids .* is not a comma-separated list of token ids")


@pytest.mark.parametrize("var", ["QWEN38_SWIGLU_FUSE", "QWEN38_OUT_XT", "QWEN38_GDN_GW"])
def test_garbage_in_an_on_off_variable_is_refused(capsys, tmp_path, monkeypatch, var):
    monkeypatch.setenv(var, "yes")
    assert_user_error(*invoke(capsys, "emit", "--batch", "2", "-o", tmp_path / "x.cu"),
                      rf"{var}='yes': use 0 \(off\) or 1 \(on, the default\)")
    assert names(tmp_path) == []


def test_pdl_garbage_is_refused(monkeypatch):
    from qwen38gen import launch
    from qwen38gen.errors import UserError

    monkeypatch.setenv("QWEN38_PDL", "off")
    with pytest.raises(UserError, match=r"QWEN38_PDL='off': use 0 \(off\) or 1"):
        launch.enabled()
    monkeypatch.setenv("QWEN38_PDL", "0")
    assert launch.enabled() is False


def test_a_tune_file_that_is_a_device_is_not_read_forever(capsys, tmp_path):
    assert_user_error(*invoke(capsys, "emit", "--batch", "2", "-o", tmp_path / "x.cu",
                              "--tune-file", "/dev/zero"),
                      r"tune file '/dev/zero' is not a regular file")


def test_a_huge_max_tokens_is_named_on_its_request_not_on_ctx(capsys, tmp_path):
    (tmp_path / "r.jsonl").write_text(json.dumps({"id": "big", "prompt_ids": [1, 2],
                                                  "max_tokens": 10**9}) + "\n")
    rc, out, err = invoke(capsys, *run_args("--prompts", tmp_path / "r.jsonl"))
    assert_user_error(rc, out, err, r"request 'big': a prompt of 2 tokens and max_tokens "
                                    r"1000000000 need 1000000001 positions; 'tiny' holds \d+")
    assert "--ctx" not in err


def test_a_gptq_folder_given_as_weights_says_to_quantize(tmp_path):
    from qwen38gen.config import PRESETS
    from qwen38gen.errors import UserError
    from qwen38gen.quantize import load_any

    raw = PRESETS["tiny"].to_hf_dict()
    raw["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match=r"is a gptq int4 checkpoint.*qwen38gen quantize .*/g "
                                        r"-o g-q4"):
        load_any(tmp_path / "g", PRESETS["tiny"])


# ------------------------------------------------------------- found by tests/test_fuzz.py
@pytest.mark.parametrize("key,value,pattern", [
    ("num_hidden_layers", 174958036117391182640, r"num_hidden_layers is 174958036117391182640; "
                                                 r"expected an integer ≤ 4096"),
    ("vocab_size", 2**40, r"vocab_size is 1099511627776; expected an integer ≤ 2147483647"),
])
def test_a_config_size_too_large_is_refused_at_once(capsys, tmp_path, key, value, pattern):
    """num_hidden_layers 1.7e20 built a layer list for minutes, to the machine's memory."""
    from qwen38gen.config import PRESETS

    raw = PRESETS["tiny"].to_hf_dict()
    raw[key] = value
    raw.pop("layer_types", None)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    t0 = time.monotonic()
    assert_user_error(*invoke(capsys, "info", tmp_path / "config.json"), pattern)
    assert time.monotonic() - t0 < 5


def test_a_bad_config_file_is_named_by_its_path_not_its_folder(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert_user_error(*invoke(capsys, "info", tmp_path / "m"),
                      r"^error: config file '.*/m/config\.json': missing key 'num_hidden_layers'")


@pytest.mark.parametrize("args", [("--mtp", "-1"), ("--mtp=-1",)])
def test_a_negative_optional_value_names_its_option(capsys, tmp_path, args):
    assert_user_error(*invoke(capsys, "emit", "--batch", "2", *args, "-o", tmp_path / "x.cu"),
                      r"^error: --mtp -1: a negative value is not accepted; see `qwen38gen emit -h`")
    assert names(tmp_path) == []
