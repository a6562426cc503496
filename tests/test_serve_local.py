"""``serve --backend local``: a real model behind the real gateway, on a CPU.

Two models: ``--model-spec tiny`` (random weights, no tokenizer: ids as text) and a tiny
Llama checkpoint built here (``config.json``, random weights saved with safetensors, a
byte-level BPE ``tokenizer.json`` trained on a few sentences), so that loading,
tokenisation, incremental detokenisation and the EOS stop run end to end without a
download. Every streamed token is checked against a plain per-request reference forward
(``tests/test_execute_correctness.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

from cli_helpers import assert_user_error, run_main  # noqa: E402
from serve_helpers import LiveServer, live_server, sse_events  # noqa: E402
from sloserve.core.request import RequestStatus  # noqa: E402
from sloserve.engine.execute import LoadedModel, load_model  # noqa: E402
from sloserve.serve.backend import GenerationRequest, ServeError, TokenChunk  # noqa: E402
from sloserve.serve.emulated_config import EmulatedConfig  # noqa: E402
from sloserve.serve.local import LocalBackend  # noqa: E402
from sloserve.serve.local_text import (  # noqa: E402
    IncrementalDetokenizer,
    PromptEncoder,
    StopMatcher,
)
from test_execute_correctness import reference  # noqa: E402

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a café serves crème brûlée",
    "sloserve schedules tokens on one engine",
    "hello world, hello tokens",
]
PROMPT = "hello world"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('no system messages') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def train_tokenizer() -> Any:
    """A byte-level BPE (GPT-2 style: a multi-byte character may span tokens) with BOS."""
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    return tok


def write_checkpoint(path: Path, eos: int | None = None, std: float = 0.3) -> Any:
    """A 2-layer Llama checkpoint in Hugging Face's layout; returns its tokenizer."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": {"content": "</s>"}}
    ))  # fmt: skip
    vocab, h, layers, nq, nkv, inter = tok.get_vocab_size(), 64, 2, 4, 2, 128
    d = h // nq
    cfg: dict[str, Any] = {
        "model_type": "llama", "hidden_size": h, "num_hidden_layers": layers,
        "num_attention_heads": nq, "num_key_value_heads": nkv, "intermediate_size": inter,
        "vocab_size": vocab, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    }  # fmt: skip
    if eos is not None:
        cfg["eos_token_id"] = eos
    (path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> Any:
        # std 0.3: a random model whose greedy tokens vary (at 0.02 it repeats one token)
        return torch.randn(*shape, generator=g) * std

    w = {"model.embed_tokens.weight": rnd(vocab, h), "model.norm.weight": torch.ones(h),
         "lm_head.weight": rnd(vocab, h)}  # fmt: skip
    for i in range(layers):
        p = f"model.layers.{i}."
        w |= {
            p + "self_attn.q_proj.weight": rnd(nq * d, h),
            p + "self_attn.k_proj.weight": rnd(nkv * d, h),
            p + "self_attn.v_proj.weight": rnd(nkv * d, h),
            p + "self_attn.o_proj.weight": rnd(h, nq * d),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "mlp.gate_proj.weight": rnd(inter, h),
            p + "mlp.up_proj.weight": rnd(inter, h),
            p + "mlp.down_proj.weight": rnd(h, inter),
        }
    save_file(w, str(path / "model.safetensors"))
    return tok


class Checkpoint:
    """The test checkpoint, its tokenizer, and the reference continuation of PROMPT up to
    and including its EOS (chosen as a token the greedy model emits a few tokens in)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tok = write_checkpoint(path)
        self.prompt_ids = list(self.tok.encode(PROMPT).ids)
        ref = reference(load_model(model_path=path), self.prompt_ids, 16)
        special = {self.tok.token_to_id("<s>"), self.tok.token_to_id("</s>")}
        k = next(i for i in range(3, 16) if ref[i] not in ref[:i] and ref[i] not in special)
        self.eos = ref[k]
        self.until_eos = ref[: k + 1]
        write_checkpoint(path, eos=self.eos)  # same weights (same seed), now with an EOS
        self.loaded = load_model(model_path=path)

    def greedy_until_eos(self, prompt_ids: list[int], n: int) -> list[int]:
        out = reference(self.loaded, prompt_ids, n)
        return out[: out.index(self.eos) + 1] if self.eos in out else out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    torch.set_num_threads(1)
    return Checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-llama")


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    torch.set_num_threads(1)
    return load_model(model_spec="tiny", device="cpu", seed=0)


@pytest.fixture(scope="module")
def tiny_server(tiny: LoadedModel) -> Iterator[LiveServer]:
    with live_server(LocalBackend(EmulatedConfig(policy="vllm"), tiny)) as srv:
        yield srv


@pytest.fixture(scope="module")
def ckpt_server(ckpt: Checkpoint) -> Iterator[LiveServer]:
    be = LocalBackend(EmulatedConfig(policy="sarathi"), load_model(model_path=ckpt.path))
    with live_server(be) as srv:
        yield srv


def _stream(base_url: str, path: str, body: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """A streaming request: each token chunk's text, and the finish/usage summary."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(f"{base_url}/{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    texts: list[str] = []
    out: dict[str, Any] = {}
    for e in sse_events(r):
        if e == "[DONE]":
            continue
        obj = json.loads(e)
        if obj.get("usage"):
            out["usage"] = obj["usage"]
        for c in obj["choices"]:
            piece = c.get("text", c.get("delta", {}).get("content"))
            if piece:
                texts.append(piece)
            if c.get("finish_reason"):
                out["finish_reason"] = c["finish_reason"]
    return texts, out


def _ids(text: str) -> list[int]:
    return [int(t) for t in text.split()]


# ----------------------------------------------------------------------------- tiny spec
def test_streamed_tokens_equal_the_reference(tiny_server: LiveServer, tiny: LoadedModel) -> None:
    """Concurrent streams (batched, paged) carry the reference's tokens, max_tokens each."""
    enc = PromptEncoder(None, tiny.model.spec.vocab_size)
    prompts = [("the cat sat on the mat", 9), ("hello", 5), ("one two three four five", 12)]

    async def main() -> list[tuple[list[str], dict[str, Any]]]:
        return list(
            await asyncio.gather(*(
                asyncio.to_thread(_stream, tiny_server.base_url, "completions",
                                  {"model": "tiny", "prompt": p, "max_tokens": n})
                for p, n in prompts
            ))
        )  # fmt: skip

    for (prompt, n), (texts, out) in zip(prompts, asyncio.run(main()), strict=True):
        ids = enc.encode_text(prompt)
        assert _ids("".join(texts)) == reference(tiny, ids, n)
        assert len(texts) == n and out["finish_reason"] == "length"
        assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": n,
                                "total_tokens": len(ids) + n}  # fmt: skip


def test_non_streaming_completion_and_chat(tiny_server: LiveServer, tiny: LoadedModel) -> None:
    enc = PromptEncoder(None, tiny.model.spec.vocab_size)
    url = tiny_server.base_url
    body = {"model": "tiny", "prompt": "a b c", "max_tokens": 6}
    r = httpx.post(f"{url}/completions", json=body, timeout=60).json()
    ids = enc.encode_text("a b c")
    assert _ids(r["choices"][0]["text"]) == reference(tiny, ids, 6)
    assert r["usage"]["completion_tokens"] == 6 and r["usage"]["prompt_tokens"] == len(ids)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    chat_ids = enc.encode_text("system: be brief\nuser: hi there\nassistant:")
    want = reference(tiny, chat_ids, 4)
    r = httpx.post(f"{url}/chat/completions", json={"model": "tiny", "messages": msgs,
                                                    "max_tokens": 4}, timeout=60).json()  # fmt: skip
    assert _ids(r["choices"][0]["message"]["content"]) == want
    assert r["choices"][0]["finish_reason"] == "length"
    texts, out = _stream(url, "chat/completions", {"model": "tiny", "messages": msgs,
                                                   "max_tokens": 4})  # fmt: skip
    assert _ids("".join(texts)) == want and out["usage"]["completion_tokens"] == 4


def test_metrics_are_the_emulated_backends(tiny_server: LiveServer) -> None:
    """The gateway's metrics and vLLM's engine metrics, read between the worker's steps."""
    url = tiny_server.url
    before = httpx.get(f"{url}/metrics", timeout=30).text
    assert 'sloserve_replica_running{replica="replica-0"}' in before
    series = 'vllm:generation_tokens_total{engine="0",model_name="tiny",replica="replica-0"}'

    def generated(text: str) -> float:
        line = next(ln for ln in text.splitlines() if ln.startswith(series))
        return float(line.rsplit(" ", 1)[1])

    body = {"model": "tiny", "prompt": "count me", "max_tokens": 7}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
    after = httpx.get(f"{url}/metrics", timeout=30).text
    assert generated(after) == generated(before) + 7
    assert 'vllm:time_to_first_token_seconds_count{engine="0"' in after


def test_disconnect_aborts_and_frees_kv(tiny_server: LiveServer) -> None:
    be = tiny_server.backend
    assert isinstance(be, LocalBackend)
    body = {"model": "tiny", "prompt": "x " * 200, "max_tokens": 3000, "stream": True}
    with (
        httpx.Client(timeout=30) as c,
        c.stream("POST", f"{tiny_server.base_url}/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert sum(1 for ln in got if ln.startswith("data: ")) == 3
        (inst,) = be.instances()
        assert inst.kv.num_used_blocks > 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (inst.kv.num_used_blocks or inst.num_live):
        time.sleep(0.01)
    assert inst.kv.num_used_blocks == 0 and inst.num_live == 0
    gone = inst.done[-1]
    assert gone.status is RequestStatus.ABORTED and 3 <= gone.num_output_tokens < 3000
    assert be.executor is not None and be.executor.tokens(gone.req_id) == []  # forgotten
    inst.kv.check_invariants()


def _greq(prompt: str, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        request_id="cmpl-t", endpoint="completions", model="tiny", prompt_tokens=1,
        max_tokens=max_tokens, arrival=time.monotonic(),
        body={"prompt": prompt, "max_tokens": max_tokens},
    )  # fmt: skip


def test_tokens_leave_before_the_next_forward_pass(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hand-off: when a forward pass starts, every token of the iterations before it
    is already on its stream (not one iteration late), and the event loop keeps running
    while the model computes (a slow forward pass does not stall it)."""
    from sloserve.engine.execute import TorchExecutor

    be = LocalBackend(EmulatedConfig(policy="vllm"), tiny)
    lags: list[int] = []
    real_run = TorchExecutor.run

    def slow_run(self: TorchExecutor, batch: Any) -> float:
        for r, _n in batch.batch:
            s = be._streams.get(r.req_id)
            if s is not None:
                lags.append(r.num_output_tokens - s.sent)
        time.sleep(0.4)  # in the worker thread: the loop must not notice
        return real_run(self, batch)

    monkeypatch.setattr(TorchExecutor, "run", slow_run)

    async def main() -> tuple[int, float]:
        await be.start()
        gaps = [0.0]
        done = asyncio.Event()

        async def tick() -> None:
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        chunks = [c async for c in be.generate(_greq("one two three", 4))]
        done.set()
        await ticker
        await be.stop()
        return sum(c.num_tokens for c in chunks), max(gaps)

    n, worst_gap = asyncio.run(asyncio.wait_for(main(), 30))
    assert n == 4 and len(lags) == 4
    assert lags == [0, 0, 0, 0]
    assert worst_gap < 0.25  # each forward pass sleeps 0.4 s: a blocked loop shows it


def test_engine_error_restarts_the_replica_and_shutdown_ends_streams(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward pass that raises (in the worker thread) ends that replica's streams with
    a 500 ``engine_error``; a fresh engine then serves the reference's tokens; a shutdown
    ends a stream still open with ``shutdown`` and frees its KV."""
    from sloserve.engine.execute import TorchExecutor

    be = LocalBackend(EmulatedConfig(policy="vllm"), tiny)
    real_run = TorchExecutor.run
    calls = [0]

    def flaky(self: TorchExecutor, batch: Any) -> float:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("device lost")
        return real_run(self, batch)

    monkeypatch.setattr(TorchExecutor, "run", flaky)

    async def main() -> None:
        await be.start()
        first = be.executor
        got: list[TokenChunk] = []
        with pytest.raises(ServeError) as ei:
            async for c in be.generate(_greq("a b", 10)):
                got.append(c)
        assert ei.value.status == 500 and ei.value.reason == "engine_error"
        assert len(got) == 2 and "device lost" in str(ei.value)
        text = "".join([c.text async for c in be.generate(_greq("a b", 5))])
        assert be.executor is not first  # the restarted engine has its own executor
        assert _ids(text) == reference(tiny, PromptEncoder(None, 256).encode_text("a b"), 5)
        (inst,) = be.instances()
        stream = be.generate(_greq("x " * 50, 3000))
        for _ in range(3):
            await stream.__anext__()
        stop = asyncio.create_task(be.stop(drain_timeout_s=0.05))
        with pytest.raises(ServeError) as ei:
            async for _c in stream:
                pass
        await stop
        assert ei.value.reason == "shutdown"
        assert inst.kv.num_used_blocks == 0 and inst.num_live == 0

    asyncio.run(asyncio.wait_for(main(), 30))


def test_stop_string_ends_the_stream_and_frees_the_request(
    tiny_server: LiveServer, tiny: LoadedModel
) -> None:
    """A stop string spanning two tokens: the text before it, ``stop``, the tokens up to
    the one that completed it; the engine then drops the request."""
    ids = PromptEncoder(None, 256).encode_text("stop here")
    ref = reference(tiny, ids, 30)
    pieces = [f" {t}" for t in ref]
    full = "".join(pieces)
    stop = f"{ref[3]} {ref[4]}"
    at = full.find(stop)
    n = next(k for k in range(1, 31) if len("".join(pieces[:k])) >= at + len(stop))
    texts, out = _stream(tiny_server.base_url, "completions",
                         {"model": "tiny", "prompt": "stop here", "max_tokens": 30,
                          "stop": ["never", stop]})  # fmt: skip
    assert "".join(texts) == full[:at] and out["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == n < 30
    be = tiny_server.backend
    assert isinstance(be, LocalBackend)
    (inst,) = be.instances()
    deadline = time.monotonic() + 10
    while inst.num_live and time.monotonic() < deadline:
        time.sleep(0.01)
    assert inst.num_live == 0 and inst.kv.num_used_blocks == 0
    assert inst.done[-1].status is RequestStatus.ABORTED


def test_stop_matcher_holds_back_a_possible_start() -> None:
    m = StopMatcher(["234 138", ""])
    assert [m.feed(" 138"), m.feed(" 234"), m.feed(" 138")] == [
        (" 138", False), (" ", False), ("", True),
    ]  # fmt: skip
    m = StopMatcher(["234"])
    assert m.feed("x23") == ("x", False)
    assert m.feed("5", last=True) == ("235", False)  # the stream's end flushes what waited


def test_bad_requests(tiny_server: LiveServer) -> None:
    url = f"{tiny_server.base_url}/completions"
    r = httpx.post(url, json={"model": "tiny", "prompt": [5, 256], "max_tokens": 2}, timeout=30)
    assert r.status_code == 400 and "vocabulary" in r.text
    r = httpx.post(url, json={"model": "tiny", "prompt": "a", "min_tokens": 2}, timeout=30)
    assert r.status_code == 200  # no EOS in random weights: nothing to hold back
    r = httpx.post(url, json={"model": "tiny", "prompt": [1] * 4000, "max_tokens": 200},
                   timeout=30)  # fmt: skip
    assert r.status_code == 400 and "context" in r.text


# ----------------------------------------------------------------------------- a checkpoint
def test_checkpoint_detokenised_stream_stops_at_eos(
    ckpt_server: LiveServer, ckpt: Checkpoint
) -> None:
    """Real text, incrementally detokenised, ends at the checkpoint's EOS with 'stop'."""
    texts, out = _stream(ckpt_server.base_url, "completions",
                         {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 40})  # fmt: skip
    n = len(ckpt.until_eos)
    assert out["finish_reason"] == "stop"
    assert out["usage"] == {"prompt_tokens": len(ckpt.prompt_ids), "completion_tokens": n,
                            "total_tokens": len(ckpt.prompt_ids) + n}  # fmt: skip
    assert "".join(texts) == ckpt.tok.decode(ckpt.until_eos)
    r = httpx.post(f"{ckpt_server.base_url}/completions", timeout=60, json={
        "model": "tiny-llama", "prompt": PROMPT, "max_tokens": 20, "ignore_eos": True,
    }).json()  # fmt: skip
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 20
    assert r["choices"][0]["text"].startswith(ckpt.tok.decode(ckpt.until_eos))


def test_checkpoint_chat_uses_its_template(ckpt_server: LiveServer, ckpt: Checkpoint) -> None:
    """A chat is rendered by tokenizer_config.json's template (BOS written by it, not
    added twice); the template's own error is a 400."""
    assert ckpt.loaded.chat_template == CHAT_TEMPLATE
    url = f"{ckpt_server.base_url}/chat/completions"
    msgs = [{"role": "user", "content": "hello tokens"}]
    ids = ckpt.tok.encode("<s><|user|>hello tokens<|assistant|>", add_special_tokens=False).ids
    assert ids[0] == ckpt.tok.token_to_id("<s>") and ids[1] != ids[0]
    want = ckpt.greedy_until_eos(ids, 12)
    r = httpx.post(url, json={"model": "tiny-llama", "messages": msgs, "max_tokens": 12},
                   timeout=60).json()  # fmt: skip
    assert r["usage"]["prompt_tokens"] == len(ids)
    assert r["usage"]["completion_tokens"] == len(want)
    assert r["choices"][0]["message"]["content"] == ckpt.tok.decode(want)
    bad = [{"role": "system", "content": "x"}, *msgs]
    r2 = httpx.post(url, json={"model": "tiny-llama", "messages": bad}, timeout=60)
    assert r2.status_code == 400 and "no system messages" in r2.text


def test_incremental_detokenizer_waits_for_whole_characters(ckpt: Checkpoint) -> None:
    tok = ckpt.tok
    text = " héllo 日本語 ok"
    prompt = tok.encode("hello").ids
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) > len(text.split())  # some characters span several tokens
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = [detok.add(t, last=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces  # held back while a character was incomplete
    cut = IncrementalDetokenizer(tok, prompt)
    partial = [cut.add(t) for t in ids[:2]] + [cut.add(ids[2], last=True)]
    assert "".join(partial) == tok.decode(ids[:3])  # the last token flushes what is left


def test_cli_serves_a_checkpoint(
    ckpt: Checkpoint, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sloserve serve --backend local --model PATH``: the command builds the backend and
    hands it to uvicorn (caught here, in process: a subprocess would spend most of this
    test importing PyTorch), which then streams real text through the gateway."""
    from sloserve.serve.server import GatewayServer

    served: list[Any] = []
    with monkeypatch.context() as m:
        m.setattr(GatewayServer, "run", lambda self, *a, **k: served.append(self.config))
        proc = run_main(m, capsys, "serve", "--backend", "local", "--model", str(ckpt.path),
                        "--policy", "andes", "--max-queue", "4")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "local tiny-llama on cpu, policy andes, model 'tiny-llama'" in proc.stderr
    (config,) = served
    be = config.app.state.backend
    assert isinstance(be, LocalBackend) and be.config.max_queue == 4
    with live_server(be) as srv:
        texts, out = _stream(srv.base_url, "completions",
                             {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 40})  # fmt: skip
    assert "".join(texts) == ckpt.tok.decode(ckpt.until_eos)
    assert out["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--model", "/no/such/checkpoint"], ["--model /no/such/checkpoint", "no such"]),
        ([], ["--backend local needs --model"]),
        (["--model-spec", "tiny", "--replicas", "2"], ["--replicas 2"]),
        (["--model-spec", "tiny", "--device", "tpu"], ["--device"]),
        (["--model-spec", "tiny", "--temperature", "-1"], ["--temperature", "-1"]),
        (["--model-spec", "tiny", "--time-scale", "5"], ["--time-scale 5"]),
    ],
)
def test_cli_bad_input(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
    needles: list[str],
) -> None:  # fmt: skip
    proc = run_main(monkeypatch, capsys, "serve", "--backend", "local", *args)
    assert_user_error(proc, *needles)
