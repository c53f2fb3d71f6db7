"""The gateway's router over KV events: decoding what vLLM, SGLang and prefixscope publish (from batches built with
the reference structs of `tests/kv_events_reference`, written from vLLM's public definitions), the token-id index
with its tiers and namespaces, and a whole gateway in front of a simulated vLLM fleet (stub OpenAI servers plus
reference publishers) routing by those events, replaying a gap and falling back while events are missing."""

from __future__ import annotations

import json
import threading
import time
import tomllib
from contextlib import ExitStack
from pathlib import Path

import httpx
import msgspec
import pytest
from gateway_testkit import gateway_config, running_gateway, serve_in_thread, wait_until
from stub_upstream import StubUpstream
from tokenizers import Tokenizer, models, pre_tokenizers

from gateway.config import UpstreamConfig, parse_config
from gateway.errors import ConfigError
from gateway.replicas.event_index import EventIndex, block_keys
from gateway.replicas.kv_event_wire import DEVICE, DISK, HOST, Cleared, MalformedEvents, Removed, Stored, decode_batch
from gateway.config.router import ReplicaEvents, RouterSettings
from tests.kv_events_reference import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ReferencePublisher,
)

SIZE = 16


def payload(*events) -> bytes:
    return msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=list(events)))


def stored(hashes, parent, tokens, medium="GPU", salt=None) -> BlockStored:
    extra = [(salt,)] + [None] * (len(hashes) - 1) if salt is not None else None
    return BlockStored(list(hashes), parent, list(tokens), SIZE, None, medium, extra_keys=extra)


# ---- decoding -----------------------------------------------------------------------------------------------------


def test_array_like_batches_decode_with_namespaces_tiers_and_unroutable_events_left_out():
    events = decode_batch(payload(
        stored([1, 2], None, range(32), salt="tenant-salt"),
        stored([3], 2, range(32, 48), medium="CPU"),
        BlockStored([4], None, [], 0, None, "CPU"),  # an offloaded chunk with no tokens: nothing to route on
        BlockRemoved([1], "GPU"),
        AllBlocksCleared(),
    ))
    assert events == [
        Stored((1, 2), None, list(range(32)), SIZE, DEVICE, "tenant-salt"),
        Stored((3,), 2, list(range(32, 48)), SIZE, HOST, None),
        Removed((1,), DEVICE),
        Cleared(),
    ]


def test_the_older_six_field_and_the_map_layouts_decode_too():
    older = msgspec.msgpack.encode(
        [1.0, [["BlockStored", [7], None, list(range(16)), 16, None], ["BlockRemoved", [7]]]]
    )
    assert decode_batch(older) == [Stored((7,), None, list(range(16)), 16, DEVICE, ""), Removed((7,), DEVICE)]
    digest = b"\x01" * 32  # vLLM's raw SHA-256 block hashes
    as_maps = msgspec.msgpack.encode({"ts": 1.0, "events": [
        {"type": "BlockStored", "block_hashes": [digest], "parent_block_hash": None, "token_ids": list(range(16)),
         "block_size": 16, "lora_id": None, "medium": "DISK", "cache_salt": "s"},
        {"type": "BlockMigrated", "block_hashes": [digest]},  # a kind this router does not know: skipped
    ]})
    assert decode_batch(as_maps) == [Stored((digest,), None, list(range(16)), 16, DISK, "s")]
    for bad in (b"\xc1", msgspec.msgpack.encode({"events": 3}), msgspec.msgpack.encode([1.0, [["BlockStored", 5]]])):
        with pytest.raises(MalformedEvents):
            decode_batch(bad)


# ---- the index ----------------------------------------------------------------------------------------------------


def test_the_index_matches_by_token_ids_weighs_tiers_and_keeps_namespaces_apart():
    index = EventIndex()
    prompt = list(range(100, 164))  # four blocks
    index.apply(decode_batch(payload(stored([11, 12], None, prompt[:32], salt="a"), stored([13], 12, prompt[32:48]))))
    keys = block_keys("a", prompt, SIZE)
    assert index.match(keys, 0.0) == (3, 3.0)
    assert index.match(block_keys("b", prompt, SIZE), 0.0) == (0, 0.0)  # the same tokens in another namespace
    assert index.holds_namespace("a") and not index.holds_namespace("b")
    # Demoted to the host: still held, worth less than a device hit.
    index.apply(decode_batch(payload(stored([13], 12, prompt[32:48], medium="CPU"), BlockRemoved([13], "GPU"))))
    assert index.match(keys, 0.0) == (3, 2.8) and index.blocks_per_tier() == {"device": 2, "host": 1, "disk": 0}
    index.apply(decode_batch(payload(BlockRemoved([12], "GPU"))))
    assert index.match(keys, 0.0) == (1, 1.0)  # a chain stops at its first missing block
    index.apply(decode_batch(payload(stored([99], 98, prompt[48:64]))))  # a parent never seen: not indexed
    assert index.orphans == 1
    index.expect(keys, until=10.0)
    assert index.match(keys, 5.0)[0] == 4 and index.match(keys, 11.0)[0] == 1
    index.apply([Cleared()])
    assert index.num_blocks() == 0 and index.match(keys, 5.0) == (0, 0.0)


def test_replicas_take_kv_events_endpoints_and_a_tokenizer_from_the_config():
    text = """
    [[upstreams]]
    name = "fleet"
    kind = "vllm"
    replicas = [
      { url = "http://10.0.0.1:8000", kv_events = "tcp://10.0.0.1:5557", kv_events_replay = "tcp://10.0.0.1:5558" },
      "http://10.0.0.2:8000",
    ]
    [upstreams.router]
    tokenizer = "/models/llama"
    """
    upstream = parse_config(tomllib.loads(text)).upstreams[0]
    assert upstream.replicas == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
    assert upstream.replica_events == (ReplicaEvents("tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"), None)
    assert upstream.router.tokenizer == "/models/llama"
    for bad in ('{ url = "http://a:1", kv_events = "http://a:2" }',
                '{ url = "http://a:1", kv_events_replay = "tcp://a:2" }',
                '{ url = "http://a:1", kv_event = "tcp://a:2" }'):
        with pytest.raises(ConfigError):
            parse_config(tomllib.loads(f'[[upstreams]]\nname = "f"\nreplicas = [{bad}]\n'))


# ---- a gateway in front of a simulated vLLM fleet -------------------------------------------------------------------

TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m.role }} {{ m.content }} <|im_end|> {% endfor %}"
            "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def write_tokenizer(directory: Path) -> Tokenizer:
    """A word-level tokenizer (one token per word) and a chat template, as a model directory holds them."""
    words = ["[UNK]", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", *(f"w{i}" for i in range(400))]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return tokenizer


def prompt_ids(tokenizer: Tokenizer, system: str, question: str) -> list[int]:
    text = f"<|im_start|> system {system} <|im_end|> <|im_start|> user {question} <|im_end|> <|im_start|> assistant"
    return tokenizer.encode(text).ids


class Fleet:
    """Three stub vLLM servers, each with a reference KV-event publisher answering replays in the background."""

    def __init__(self, stack: ExitStack) -> None:
        self.stubs = [StubUpstream() for _ in range(3)]
        self.urls = [stack.enter_context(serve_in_thread(stub)) for stub in self.stubs]
        self.publishers = [ReferencePublisher() for _ in range(3)]
        stack.callback(self.close)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve_replays, daemon=True)
        self._thread.start()
        self.next_hash = 1000

    def _serve_replays(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                for publisher in self.publishers:
                    publisher.serve_replays(0)
            time.sleep(0.01)

    def store(self, replica: int, tokens: list[int], salt: str, medium: str = "GPU", send: bool = True) -> list[int]:
        """Replica `replica` announces the full blocks of `tokens` (one chain from the root) in `medium`."""
        hashes = list(range(self.next_hash, self.next_hash + len(tokens) // SIZE))
        self.next_hash += len(hashes)
        with self._lock:
            self.publishers[replica].publish([stored(hashes, None, tokens[: len(hashes) * SIZE], medium, salt)],
                                             send=send)
        return hashes

    def publish(self, replica: int, events, send: bool = True) -> None:
        with self._lock:
            self.publishers[replica].publish(events, send=send)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for publisher in self.publishers:
            publisher.close()


def fleet_config(fleet: Fleet, tokenizer_dir: Path, **router):
    settings = RouterSettings(health_interval_s=0.2, replay_timeout_s=1.0, tokenizer=str(tokenizer_dir), **router)
    events = tuple(ReplicaEvents(p.endpoint, p.replay_endpoint) for p in fleet.publishers)
    upstream = UpstreamConfig(name="fleet", url=fleet.urls[0], kind="vllm", timeout_s=30.0, replicas=tuple(fleet.urls),
                              replica_events=events, routing="cache_aware", router=settings)
    return gateway_config(fleet.urls[0], upstreams=(upstream,), default_upstream="fleet")


def replica_states(gateway_url: str) -> list[dict]:
    return httpx.get(f"{gateway_url}/health", timeout=5).json()["upstreams"][0]["replicas"]


def test_a_vllm_fleet_is_routed_by_its_kv_events(tmp_path):
    tokenizer = write_tokenizer(tmp_path / "model")
    system = " ".join(f"w{i}" for i in range(64))

    def ask(gateway, question: str) -> None:
        body = {"model": "llama", "max_tokens": 2,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30).status_code == 200

    with ExitStack() as stack:
        fleet = Fleet(stack)
        gateway = stack.enter_context(running_gateway(fleet_config(fleet, tmp_path / "model")))
        assert wait_until(lambda: all(r["events"] == "synced" for r in replica_states(gateway.url)), 20)
        ask(gateway, "w300")  # nothing announced anywhere: placed by load, predicted from (empty) events
        first = gateway.wait_records(1)[0]
        assert (first.routing_index_source, first.predicted_match_tokens) == ("events", 0)
        salt = next(stub.state.requests[0]["cache_salt"] for stub in fleet.stubs if stub.state.requests)
        tokens = prompt_ids(tokenizer, system, "w301")
        # Replica 2 announces the shared prefix (66 tokens: four full blocks) on its device.
        fleet.store(2, tokens[:66], salt)
        assert wait_until(lambda: replica_states(gateway.url)[2]["event_blocks"]["device"] == 4, 10)
        ask(gateway, "w301")
        record = gateway.wait_records(2)[1]
        assert (record.replica, record.routing_index_source) == (fleet.urls[2], "events")
        assert record.predicted_match_tokens == 64
        # The same blocks on replica 1's device, while replica 2 demoted them to host memory: the device hit wins.
        fleet.store(1, tokens[:66], salt)
        demoted = list(range(1000, 1004))  # replica 2's hashes of those four blocks
        fleet.publish(2, [stored(demoted, None, tokens[:64], "CPU", salt), BlockRemoved(demoted, "GPU")])
        assert wait_until(lambda: replica_states(gateway.url)[2]["event_blocks"]["host"] == 4, 10)
        ask(gateway, "w302")
        assert gateway.wait_records(3)[2].replica == fleet.urls[1]
        # A batch lost on the way (never sent live): the next one shows the gap, and the replay brings it back.
        replays = replica_states(gateway.url)[0]["event_replays"]
        fleet.store(0, prompt_ids(tokenizer, " ".join(f"w{i}" for i in range(100, 164)), "w1"), salt, send=False)
        fleet.publish(0, [BlockRemoved([424242], "GPU")])  # the next batch (names nothing held)
        assert wait_until(lambda: replica_states(gateway.url)[0]["event_gaps"] == 1, 10)
        state = replica_states(gateway.url)[0]
        assert state["event_blocks"]["device"] == 4 and state["event_replays"] == replays + 1
        assert state["events"] == "synced"


def test_a_replica_whose_events_are_missing_is_predicted_approximately(tmp_path):
    write_tokenizer(tmp_path / "model")
    with ExitStack() as stack:
        fleet = Fleet(stack)
        config = fleet_config(fleet, tmp_path / "model")
        dead = ReplicaEvents("tcp://127.0.0.1:9", "tcp://127.0.0.1:9")  # nothing answers replays there
        upstream = config.upstreams[0]
        config = type(config)(**{**config.__dict__, "upstreams": (
            type(upstream)(**{**upstream.__dict__, "replica_events": (dead, dead, dead)}),)})
        gateway = stack.enter_context(running_gateway(config))
        assert wait_until(lambda: {r["events"] for r in replica_states(gateway.url)} == {"unsynced"}, 10)
        body = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "w1 w2 w3"}]}
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30).status_code == 200
        assert gateway.wait_records(1)[0].routing_index_source == "approximate"


def test_health_is_degraded_while_no_replica_of_the_default_upstream_is_in_rotation(tmp_path):
    write_tokenizer(tmp_path / "model")
    with ExitStack() as stack:
        fleet = Fleet(stack)
        gateway = stack.enter_context(running_gateway(fleet_config(fleet, tmp_path / "model")))
        assert httpx.get(f"{gateway.url}/health", timeout=5).json()["status"] == "ok"
        fleet.stubs[0].state.health_status = 503
        assert wait_until(lambda: not replica_states(gateway.url)[0]["healthy"], 20)
        health = httpx.get(f"{gateway.url}/health", timeout=5)
        assert (health.status_code, health.json()["status"]) == (200, "ok")  # two replicas still serve
        for stub in fleet.stubs[1:]:
            stub.state.health_status = 503
        assert wait_until(lambda: not any(r["healthy"] for r in replica_states(gateway.url)), 20)
        health = httpx.get(f"{gateway.url}/health", timeout=5)
        assert health.status_code == 503
        assert health.json()["status"] == "degraded" and "'fleet'" in health.json()["reason"]
        for stub in fleet.stubs:
            stub.state.health_status = 200
        assert wait_until(lambda: httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200, 20)
