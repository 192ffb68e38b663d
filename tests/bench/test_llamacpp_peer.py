"""llama.cpp as a measured peer: what minicb decides before handing a checkpoint over (the
tokenizer it carries, the pre-tokenizer it maps to), the driver's continuous batching over a
stand-in llama.cpp, the result read back; and, where `make peer-llamacpp` has built it, the real
converter, tokenizer and greedy tokens."""

from __future__ import annotations

import argparse
import copy
import ctypes
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

from minicb.bench import llamacpp_peer
from minicb.bench.llamacpp_peer import LlamaCppUnavailable, driver_request, pre_tokenizer
from minicb.model.default import default_model_path

SHIPPED = Path(default_model_path())


@pytest.fixture(scope="module")
def shipped_tokenizer() -> dict:
    return json.loads((SHIPPED / "tokenizer.json").read_text())


def test_the_shipped_tokenizer_maps_to_gpt2(shipped_tokenizer):
    assert pre_tokenizer(shipped_tokenizer) == "gpt-2"
    plain = copy.deepcopy(shipped_tokenizer)          # GPT-2's own: the byte-level split alone
    plain["pre_tokenizer"] = plain["pre_tokenizer"]["pretokenizers"][-1]
    assert pre_tokenizer(plain) == "gpt-2"


@pytest.mark.parametrize("change, problem", [
    (lambda t: t["model"].update(type="WordPiece"), "WordPiece tokenizer"),
    (lambda t: t["pre_tokenizer"]["pretokenizers"][-1].update(add_prefix_space=True),
     "add_prefix_space"),
    (lambda t: t["pre_tokenizer"]["pretokenizers"][-1].update(use_regex=False),
     "GPT-2's regular expression"),
    (lambda t: t["pre_tokenizer"]["pretokenizers"][0].update(pattern={"String": " "}),
     "no llama.cpp counterpart"),
    # a newline merged with a space: isolating newlines would split differently from gpt2
    (lambda t: t["model"]["merges"].append(["\u010a", "\u0120"]), "joins a newline"),
])
def test_a_tokenizer_llamacpp_would_split_differently_is_refused(shipped_tokenizer, change,
                                                                 problem):
    tokenizer = copy.deepcopy(shipped_tokenizer)
    change(tokenizer)
    with pytest.raises(ValueError, match=problem):
        pre_tokenizer(tokenizer)


def test_a_checkpoint_without_a_tokenizer_borrows_the_shipped_one(tmp_path):
    assert llamacpp_peer.conversion_checkpoint(SHIPPED, tmp_path / "w") == SHIPPED
    random_model = tmp_path / "random"
    random_model.mkdir()
    (random_model / "config.json").write_text(json.dumps({"vocab_size": 4096}))
    (random_model / "model.safetensors").write_bytes(b"weights")
    work = llamacpp_peer.conversion_checkpoint(random_model, tmp_path / "w")
    assert (work / "model.safetensors").read_bytes() == b"weights"
    assert (work / "tokenizer.json").resolve() == (SHIPPED / "tokenizer.json").resolve()
    (random_model / "config.json").write_text(json.dumps({"vocab_size": 512}))
    with pytest.raises(ValueError, match="vocabulary .512. is not the shipped"):
        llamacpp_peer.conversion_checkpoint(random_model, tmp_path / "w2")


def test_gguf_cache_follows_the_weights(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"a")
    first = llamacpp_peer.gguf_path(tmp_path, "q8_0")
    assert first.name == "model-q8_0.gguf"
    (tmp_path / "model.safetensors").write_bytes(b"bb")     # a rebuilt checkpoint
    assert llamacpp_peer.gguf_path(tmp_path, "q8_0").parent != first.parent
    with pytest.raises(ValueError, match="choose one of"):
        llamacpp_peer.gguf_path(tmp_path, "q4_k")


def test_request_and_missing_environment(tmp_path, monkeypatch):
    settings = {"parallel": 2, "n_ctx_seq": 16, "n_batch": 64, "threads": 2}
    request = driver_request("/m.gguf", [[1, 2, 3], [4]], [5, 2], settings)
    assert request["prompts"] == [[1, 2, 3], [4]] and request["settings"] == settings
    with pytest.raises(ValueError, match="2 prompts but 1 output"):
        driver_request("/m.gguf", [[1], [2]], [3], settings)
    with pytest.raises(ValueError, match="fewer than the longest request's 8 tokens"):
        driver_request("/m.gguf", [[1, 2, 3]], [5], dict(settings, n_ctx_seq=7))
    monkeypatch.setenv("MINICB_LLAMACPP_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(LlamaCppUnavailable, match="make peer-llamacpp"):
        llamacpp_peer.check_available()
    from minicb.bench import offline

    with pytest.raises(LlamaCppUnavailable, match="make peer-llamacpp"):  # before any system
        offline.main(["--num-prompts", "2", "--systems", "continuous-paged", "--peers",
                      "llamacpp-q8_0", "--out-dir", str(tmp_path)])


def test_llamacpp_gets_minicbs_slots_context_and_step_budget():
    from minicb.bench import offline

    args = argparse.Namespace(max_num_seqs=24, max_model_len=1024, max_num_batched_tokens=1536)
    settings = offline.llamacpp_settings(args)
    assert settings["parallel"] == 24 and settings["n_ctx_seq"] == 1024
    assert settings["n_batch"] == 1536 and settings["threads"] >= 1


def test_parse_result_names_the_format_and_checks_the_work():
    result = {"llama_cpp_version": "0.0-test", "settings": {"parallel": 2},
              "system_info": "AVX512 = 1", "arrival": 10.0, "outputs": [[7, 8], [5]],
              "token_times": [[10.5, 10.75], [10.25]], "finished": [10.75, 10.25],
              "cpu_seconds": 1.5}
    run = llamacpp_peer.parse_result(result, [[1], [2]], [2, 1], "q8_0")
    assert run.settings["weights"] == "Q8_0" and run.cpu_seconds == 1.5
    assert run.metrics[0].ttft == pytest.approx(0.5)
    with pytest.raises(RuntimeError, match="llama.cpp returned 2 tokens for request 0, not 3"):
        llamacpp_peer.parse_result(result, [[1], [2]], [3, 1], "q8_0")


# --- the driver's loop over a stand-in llama.cpp -------------------------------------------------
VOCAB = 32


def fake_llama_cpp(log: list) -> types.ModuleType:
    """llama.cpp's C API as the driver calls it: each decode records its rows (token, position,
    sequence, wants logits) and answers, for every row, logits whose argmax is (token + position)
    mod VOCAB, so the next token depends on what the row held."""
    ll = types.ModuleType("llama_cpp")
    logits = {}

    def batch_init(capacity, embd, n_seq_max):
        return types.SimpleNamespace(token=[0] * capacity, pos=[0] * capacity,
                                     n_seq_id=[0] * capacity, seq_id=[[0] for _ in range(capacity)],
                                     logits=[False] * capacity, n_tokens=0)

    def decode(context, batch):
        rows = [(batch.token[i], batch.pos[i], batch.seq_id[i][0], batch.logits[i])
                for i in range(batch.n_tokens)]
        log.append(("decode", rows))
        logits.clear()
        for i, (token, position, _, wanted) in enumerate(rows):
            if wanted:
                row = (ctypes.c_float * VOCAB)()
                row[(token + position) % VOCAB] = 1.0
                logits[i] = row
        return 0

    ll.llama_vocab_n_tokens = lambda vocab: VOCAB
    ll.llama_model_get_vocab = lambda model: "vocab"
    ll.llama_get_memory = lambda context: "memory"
    ll.llama_batch_init, ll.llama_batch_free, ll.llama_decode = batch_init, lambda b: None, decode
    ll.llama_get_logits_ith = lambda context, i: ctypes.cast(logits[i],
                                                             ctypes.POINTER(ctypes.c_float))
    ll.llama_memory_seq_rm = lambda memory, seq, p0, p1: log.append(("free", seq))
    return ll


def expected_tokens(prompt: list[int], n: int) -> list[int]:
    """What the stand-in produces for one request decoded alone."""
    out, last, position = [], prompt[-1], len(prompt) - 1
    for _ in range(n):
        last = (last + position) % VOCAB
        out.append(last)
        position += 1
    return out


def test_driver_batches_requests_continuously(monkeypatch):
    spec = importlib.util.spec_from_file_location("llamacpp_driver", llamacpp_peer.DRIVER)
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    log: list = []
    monkeypatch.setitem(sys.modules, "llama_cpp", fake_llama_cpp(log))
    prompts, lengths = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], [4, 1, 3, 2]
    result = driver.serve("model", "context", prompts, lengths, parallel=2, capacity=8)
    # every request's tokens are what it would get alone: positions and sequences kept apart
    assert result["outputs"] == [expected_tokens(p, n) for p, n in zip(prompts, lengths)]
    decodes = [rows for kind, *rows in log if kind == "decode"]
    assert all(len({seq for _, _, seq, _ in rows[0]}) <= 2 for rows in decodes)  # 2 slots
    assert all(len(rows[0]) <= 8 for rows in decodes)                             # the budget
    # a slot's cells go back once per request, so four requests run through two slots
    frees = [seq for kind, *rest in log if kind == "free" for seq in rest]
    assert len(frees) == len(prompts) and set(frees) == {0, 1}
    assert [len(t) for t in result["token_times"]] == lengths
    assert all(f is not None for f in result["finished"])
    with pytest.raises(ValueError, match="raise n_batch"):
        driver.serve("model", "context", [[1] * 8], [1], parallel=2, capacity=8)


# --- the real thing, where it is built ------------------------------------------------------------
needs_llamacpp = pytest.mark.skipif(
    not (llamacpp_peer.venv_dir() / ".installed").exists(),
    reason="llama.cpp's environment is not built (make peer-llamacpp); the tests above cover "
           "the hand-over")

TEXTS = ["def add(a, b):\n    return a + b\n", "Hello, world! It's 2026.\n\n  indented\ttab",
         "    \n\n\n   x = [1, 2, 3]  # comment", "naïve café — ünïcödé ✓"]


@needs_llamacpp
@pytest.mark.slow           # converts the shipped model first (the converter imports torch)
def test_llamacpp_tokenizes_as_the_project_does():
    from transformers import AutoTokenizer

    ours = AutoTokenizer.from_pretrained(str(SHIPPED))
    assert llamacpp_peer.tokenize(SHIPPED, TEXTS, "f32") == [
        ours(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


@needs_llamacpp
def test_llamacpp_f32_agrees_with_transformers_on_the_shipped_model():
    from tests.reference import hf_greedy

    prompts = [[5, 6, 7, 8, 9], [100, 200, 300]]
    run = llamacpp_peer.run_llamacpp(SHIPPED, prompts, [6, 4], "f32",
                                     {"parallel": 2, "n_ctx_seq": 64, "n_batch": 64,
                                      "threads": 1})
    assert run.outputs == [r.token_ids for r in hf_greedy(str(SHIPPED), prompts, [6, 4])]
