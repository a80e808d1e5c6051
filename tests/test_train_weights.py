"""Weight sync into vLLM against a fake vLLM server over real HTTP (tests/fixtures/fake_vllm.py).

The LoRA tests write real adapter directories and check what the server holds after each
push, restart and failure. The NCCL tests run vLLM's HTTP choreography and a real tensor
broadcast over torch.distributed (gloo, CPU): the fake server joins the trainer's group as the
vLLM worker would — in a thread of the test process, or in a process of its own — and the
bytes it received are compared with the tensors sent.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from crl_worker.errors import InfrastructureError
from crl_worker.train.errors import TrainConfigError
from crl_worker.train.weights import (
    AdapterUpdate,
    LoraAdapterSync,
    NcclWeightSync,
    NoSync,
    TensorUpdate,
    TorchDistributedTransport,
    WeightsMismatch,
    WeightSync,
    WeightSyncError,
    WeightUpdate,
    make_weight_sync,
    pack_chunks,
    peers_url,
    push_update,
    resolve_servers,
    tensor_specs,
)
from tests.fixtures.fake_vllm import (
    FakeVllm,
    FakeVllmProcess,
    Fault,
    describe_tensor,
    plugin_packed,
)
from tests.fixtures.ports import free_port

RUN = "trun-a"


def adapter(tmp_path: Path, version: int) -> Path:
    """A PEFT-shaped adapter directory (what the fake server checks for)."""
    path = tmp_path / "adapters" / f"v{version}"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return path


@pytest.fixture
async def server() -> AsyncIterator[FakeVllm]:
    async with FakeVllm() as fake:
        yield fake


@pytest.fixture
async def lora(server: FakeVllm) -> AsyncIterator[LoraAdapterSync]:
    sync = LoraAdapterSync(server.base_url, "base-model", RUN, keep=2)
    yield sync
    await sync.aclose()


# --- LoRA ----------------------------------------------------------------------------------


async def test_each_version_is_a_new_adapter_and_only_keep_stay_loaded(
    server: FakeVllm, lora: LoraAdapterSync, tmp_path: Path
) -> None:
    assert isinstance(lora, WeightSync)
    assert (lora.version, lora.model_name()) == (0, "base-model")
    for version in (1, 2, 3, 4):
        await lora.push(AdapterUpdate(version, adapter(tmp_path, version)))
        assert lora.version == version
        assert lora.model_name() == f"{RUN}-v{version}"
    assert server.adapters == {
        f"{RUN}-v3": str(tmp_path / "adapters/v3"),
        f"{RUN}-v4": str(tmp_path / "adapters/v4"),
    }
    loads = [body for _, path, body in server.requests if path == "/v1/load_lora_adapter"]
    assert loads[0] == {"lora_name": f"{RUN}-v1", "lora_path": str(tmp_path / "adapters/v1")}
    unloads = [body for _, path, body in server.requests if path == "/v1/unload_lora_adapter"]
    assert unloads == [{"lora_name": f"{RUN}-v1"}, {"lora_name": f"{RUN}-v2"}]


async def test_a_restarted_server_gets_the_current_adapter_again(
    server: FakeVllm, lora: LoraAdapterSync, tmp_path: Path
) -> None:
    assert await lora.ensure_loaded() is False  # version 0: the base model needs nothing
    await lora.push(AdapterUpdate(1, adapter(tmp_path, 1)))
    await lora.push(AdapterUpdate(2, adapter(tmp_path, 2)))
    assert await lora.ensure_loaded() is False
    await server.restart()
    assert server.adapters == {}
    assert await lora.ensure_loaded() is True
    assert server.adapters == {f"{RUN}-v2": str(tmp_path / "adapters/v2")}
    assert (lora.version, lora.model_name()) == (2, f"{RUN}-v2")
    assert await lora.ensure_loaded() is False


async def test_a_refused_adapter_raises_with_the_servers_message_and_keeps_the_version(
    server: FakeVllm, lora: LoraAdapterSync, tmp_path: Path
) -> None:
    await lora.push(AdapterUpdate(1, adapter(tmp_path, 1)))
    with pytest.raises(InfrastructureError, match=r"No adapter found for .*missing") as caught:
        await lora.push(AdapterUpdate(2, tmp_path / "missing"))
    assert isinstance(caught.value, WeightSyncError) and caught.value.status == 404
    assert (lora.version, lora.model_name()) == (1, f"{RUN}-v1")
    assert set(server.adapters) == {f"{RUN}-v1"}


async def test_a_name_already_loaded_is_replaced_not_trusted(
    server: FakeVllm, lora: LoraAdapterSync, tmp_path: Path
) -> None:
    # v2 was published by a trainer that died before its checkpoint; this one made a new v2.
    server.adapters[f"{RUN}-v2"] = str(adapter(tmp_path, 99))
    await lora.push(AdapterUpdate(2, adapter(tmp_path, 2)))
    assert server.adapters == {f"{RUN}-v2": str(tmp_path / "adapters/v2")}


async def test_a_resumed_trainer_adopts_older_adapters_and_drops_lost_ones(
    server: FakeVllm, lora: LoraAdapterSync, tmp_path: Path
) -> None:
    for version in (1, 2, 3, 4, 5):
        server.adapters[f"{RUN}-v{version}"] = str(adapter(tmp_path, version))
    server.adapters["other-run-v9"] = "/elsewhere"  # another run's adapter is left alone
    await lora.push(AdapterUpdate(3, tmp_path / "adapters/v3"))
    assert await lora.ensure_loaded() is False
    # v4 and v5 came from steps lost with the last checkpoint; keep=2 leaves v2 and v3.
    assert set(server.adapters) == {f"{RUN}-v2", f"{RUN}-v3", "other-run-v9"}


async def test_a_server_without_the_runtime_lora_api_is_named(tmp_path: Path) -> None:
    async with FakeVllm(runtime_lora=False) as fake:
        sync = LoraAdapterSync(fake.base_url, "base-model", RUN, keep=1)
        with pytest.raises(WeightSyncError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
            await sync.push(AdapterUpdate(1, adapter(tmp_path, 1)))
        assert sync.version == 0
        await sync.aclose()


async def test_the_api_key_is_sent_and_a_wrong_one_is_reported(tmp_path: Path) -> None:
    async with FakeVllm(api_key="s3cret") as fake:
        good = LoraAdapterSync(fake.base_url, "base-model", RUN, keep=1, api_key="s3cret")
        await good.push(AdapterUpdate(1, adapter(tmp_path, 1)))
        assert set(fake.adapters) == {f"{RUN}-v1"}
        bad = LoraAdapterSync(fake.base_url, "base-model", RUN, keep=1, api_key="wrong")
        with pytest.raises(WeightSyncError, match=r"401.*Unauthorized"):
            await bad.push(AdapterUpdate(2, adapter(tmp_path, 2)))
        await good.aclose()
        await bad.aclose()


async def test_every_replica_gets_the_adapter_and_one_failing_is_named(tmp_path: Path) -> None:
    async with FakeVllm() as one, FakeVllm() as two:
        sync = LoraAdapterSync(
            one.base_url, "base-model", RUN, keep=1, peers=[one.base_url, two.base_url]
        )
        await sync.push(AdapterUpdate(1, adapter(tmp_path, 1)))
        assert set(one.adapters) == set(two.adapters) == {f"{RUN}-v1"}
        two.faults["/v1/load_lora_adapter"] = Fault(500, "engine core died")
        with pytest.raises(WeightSyncError, match=rf"{two.port}.*engine core died"):
            await sync.push(AdapterUpdate(2, adapter(tmp_path, 2)))
        assert sync.version == 1  # v1 is still loaded everywhere; v2 is not
        await two.restart()
        assert await sync.ensure_loaded() is True
        assert set(two.adapters) == {f"{RUN}-v1"}
        await sync.aclose()


async def test_a_peer_host_resolves_to_each_of_its_addresses() -> None:
    port = free_port()
    base = f"http://trun-a-inference:{port}/v1"
    assert peers_url(base, "localhost") == f"http://localhost:{port}/v1"
    assert await resolve_servers([f"http://localhost:{port}/v1"]) == [f"http://127.0.0.1:{port}/v1"]
    with pytest.raises(WeightSyncError, match="cannot resolve"):
        await resolve_servers(["http://no-such-host.invalid:8000/v1"])


# --- NCCL (the tensor transfer over gloo) --------------------------------------------------


def model_tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    """A few tensors of the dtypes a checkpoint holds, in a fixed order."""
    generator = torch.Generator().manual_seed(seed)
    return [
        ("model.embed_tokens.weight", torch.randn(32, 8, generator=generator)),
        (
            "model.layers.0.self_attn.q_proj.weight",
            torch.randn(8, 8, generator=generator).to(torch.bfloat16),
        ),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(16, 8, generator=generator).half()),
        ("model.norm.weight", torch.ones(8)),
        ("lm_head.step", torch.tensor([seed], dtype=torch.int64)),
    ]


def digests(tensors: list[tuple[str, torch.Tensor]]) -> dict[str, dict[str, Any]]:
    return {name: describe_tensor(t) for name, t in tensors}


def nccl(server: FakeVllm | FakeVllmProcess, **kwargs: Any) -> NcclWeightSync:
    # 600 bytes: the 1 KiB embedding is a chunk of its own, the rest share chunks.
    transport = TorchDistributedTransport("gloo", buffer_size_bytes=600, timeout_s=60)
    return NcclWeightSync(
        server.base_url,
        "base-model",
        transport=transport,
        trainer_address="127.0.0.1",
        manifest=tensor_specs(model_tensors(0)),
        **kwargs,
    )


WEIGHT_ROUTES = [
    "/pause",
    "/start_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/reset_prefix_cache",
    "/resume",
]


async def test_full_weights_follow_vllms_choreography_and_arrive_intact() -> None:
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600) as fake:
        sync = nccl(fake)
        assert isinstance(sync, WeightSync)
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        routes = [p for p in fake.paths() if p not in ("/metrics", "/version", "/get_world_size")]
        assert routes == ["/init_weight_transfer_engine", *WEIGHT_ROUTES]
        assert fake.state()["weights"] == digests(model_tensors(1))
        assert (sync.version, sync.model_name(), fake.paused) == (1, "base-model", False)
        assert fake.weight_version == "1"  # finish names the version (GET /weight_info)
        bodies = {path: body for _, path, body in fake.requests}
        assert bodies["/pause"] == {"mode": "keep"}
        init = bodies["/init_weight_transfer_engine"]["init_info"]
        assert init["rank_offset"] == 1 and init["world_size"] == 2 and init["packed"] is True
        update = bodies["/update_weights"]["update_info"]
        assert "packed" not in update  # vLLM 0.28 moved it into the init info
        assert update["dtype_names"] == ["float32", "bfloat16", "float16", "float32", "int64"]
        assert update["shapes"][0] == [32, 8]

        # The group stays: the next version is only the update routes.
        fake.requests.clear()
        await sync.push(TensorUpdate(2, iter(model_tensors(2))))
        assert [p for p in fake.paths() if p != "/metrics"] == WEIGHT_ROUTES
        assert fake.state()["weights"] == digests(model_tensors(2))
        await sync.aclose()


async def test_no_kv_of_the_old_weights_survives_a_push() -> None:
    # A request frozen by /pause?mode=keep holds blocks: the reset must preempt it (vLLM
    # refuses a plain reset then), and must happen before /resume.
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600, running=3) as fake:
        sync = nccl(fake)
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        assert fake.prefix_cache_resets == 1 and fake.running == 0
        [reset] = [body for _, path, body in fake.requests if path == "/reset_prefix_cache"]
        assert reset == {"reset_running_requests": "true"}
        paths = fake.paths()
        assert paths.index("/finish_weight_update") < paths.index("/reset_prefix_cache")
        assert paths.index("/reset_prefix_cache") < paths.index("/resume")
        await sync.aclose()


async def test_a_refused_cache_reset_fails_the_push_and_stays_paused() -> None:
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600) as fake:
        sync = nccl(fake)
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        fake.faults["/reset_prefix_cache"] = Fault(500, "engine dead")
        with pytest.raises(WeightSyncError, match=r"resetting the prefix cache.*engine dead"):
            await sync.push(TensorUpdate(2, iter(model_tensors(2))))
        assert sync.version == 1
        assert fake.paused  # nothing is generated from the stale cache
        await sync.push(TensorUpdate(2, iter(model_tensors(2))))
        assert (sync.version, fake.paused) == (2, False)
        await sync.aclose()


async def test_the_served_weights_are_compared_with_what_was_sent() -> None:
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600) as fake:
        sync = nccl(fake, verify_every=1)
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))  # the first check: a baseline
        await sync.push(TensorUpdate(2, iter(model_tensors(2))))
        assert (sync.verified.checked, sync.verified.skipped) == (5, [])
        # An update that does not land for one tensor: found before generation resumes.
        fake.drop = {"model.layers.0.mlp.up_proj.weight"}
        with pytest.raises(WeightsMismatch, match=r"did not change.*mlp\.up_proj"):
            await sync.push(TensorUpdate(3, iter(model_tensors(3))))
        assert (sync.version, fake.paused) == (2, True)
        # The retry that lands is compared with the last check that passed, and goes through.
        fake.drop = set()
        await sync.push(TensorUpdate(3, iter(model_tensors(3))))
        assert (sync.version, fake.paused) == (3, False)
        await sync.aclose()


async def test_the_served_weights_are_checked_every_nth_push_only() -> None:
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600) as fake:
        sync = nccl(fake, verify_every=2)
        for version in (1, 2, 3):
            await sync.push(TensorUpdate(version, iter(model_tensors(version))))
        assert fake.paths().count("/weight_checker") == 2  # pushes 1 and 3
        await sync.aclose()


async def test_vllm_before_0_28_gets_packed_in_the_update_info() -> None:
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600, vllm_version="0.27.1") as fake:
        sync = nccl(fake)
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        bodies = {path: body for _, path, body in fake.requests}
        assert "packed" not in bodies["/init_weight_transfer_engine"]["init_info"]
        assert bodies["/update_weights"]["update_info"]["packed"] is True
        assert fake.state()["weights"] == digests(model_tensors(1))
        await sync.aclose()


async def test_a_restarted_server_is_noticed_and_refilled_through_reload() -> None:
    current = model_tensors(3)
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600) as fake:
        sync = nccl(fake, reload=lambda: iter(current))
        assert await sync.ensure_loaded() is False  # nothing pushed yet, nothing to lose
        await sync.push(TensorUpdate(3, iter(current)))
        assert await sync.ensure_loaded() is False
        await fake.restart()
        assert fake.weights == {}
        assert await sync.ensure_loaded() is True
        assert sync.version == 3
        assert fake.state()["weights"] == digests(current)
        assert "/init_weight_transfer_engine" in fake.paths()  # a new group for the new process
        await sync.aclose()


async def test_without_reload_a_restart_drops_the_version_to_the_base() -> None:
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600) as fake:
        sync = nccl(fake)
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        await fake.restart()
        assert await sync.ensure_loaded() is True  # lost, and the trainer has to push
        assert sync.version == 0
        assert await sync.ensure_loaded() is False  # said once; version 0 is what it holds
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        assert fake.state()["weights"] == digests(model_tensors(1))
        await sync.aclose()


async def test_a_refused_update_raises_the_servers_message_and_keeps_the_version() -> None:
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600) as fake:
        sync = nccl(fake)
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        fake.faults["/start_weight_update"] = Fault(500, "CUDA out of memory")
        with pytest.raises(InfrastructureError, match="CUDA out of memory"):
            await sync.push(TensorUpdate(2, iter(model_tensors(2))))
        assert sync.version == 1
        assert fake.paused  # the server was paused and is not resumed with a half update
        await sync.aclose()


async def test_a_stream_that_does_not_match_its_manifest_fails_fast() -> None:
    async with FakeVllm(receiver="gloo", buffer_size_bytes=600) as fake:
        sync = nccl(fake)
        await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        wrong = [(name, t.float()) for name, t in model_tensors(2)]
        with pytest.raises(WeightSyncError, match="manifest announced"):
            await sync.push(TensorUpdate(2, iter(wrong)))
        assert sync.version == 1
        # The next push rebuilds the group and goes through.
        await sync.push(TensorUpdate(2, iter(model_tensors(2))))
        assert fake.state()["weights"] == digests(model_tensors(2))
        await sync.aclose()


async def test_a_missing_dev_mode_is_reported_by_the_first_push() -> None:
    async with FakeVllm(dev_mode=False) as fake:
        sync = nccl(fake)
        with pytest.raises(WeightSyncError, match=r"get_world_size.*Not Found"):
            await sync.push(TensorUpdate(1, iter(model_tensors(1))))
        assert sync.version == 0
        await sync.aclose()


@pytest.fixture
def receiver_process() -> Iterator[FakeVllmProcess]:
    process = FakeVllmProcess(free_port(), "--receiver", "gloo", "--buffer-size", "600").start()
    yield process
    process.stop()


async def test_tensors_reach_a_receiver_in_another_process(
    receiver_process: FakeVllmProcess,
) -> None:
    current = model_tensors(5)
    sync = nccl(receiver_process, reload=lambda: iter(current))
    await sync.push(TensorUpdate(5, iter(current)))
    assert receiver_process.state()["weights"] == digests(current)
    receiver_process.restart()
    assert receiver_process.state()["weights"] == {}
    assert await sync.ensure_loaded() is True
    assert receiver_process.state()["weights"] == digests(current)
    await sync.aclose()


def test_packing_cuts_where_vllms_consumer_does() -> None:
    tensors = [(f"t{i}", torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate([4, 4, 4, 9, 1])]
    # Close a chunk once it exceeds 8 bytes: 4+4+4 | 9 | 1.
    assert [c.numel() for c in pack_chunks(iter(tensors), 8)] == [12, 9, 1]


class _Wire:
    """The receiving side of a group's broadcasts: each one fills the receiver's buffer with the
    producer's next chunk (the process test above sends them over gloo for real)."""

    def __init__(self, chunks: list[torch.Tensor]) -> None:
        self.chunks = iter(chunks)

    def broadcast(self, buffers: list[torch.Tensor], options: Any) -> Any:
        chunk = next(self.chunks)
        (buffer,) = buffers
        assert options.rootRank == 0 and buffer.numel() == chunk.numel()  # cut where packed
        buffer.copy_(chunk)
        return SimpleNamespace(wait=lambda: None)


def test_the_plugins_consumer_reads_back_what_the_producer_packs() -> None:
    # The plugin's unpacking (the fake server runs the same code): a tensor after one of a
    # narrower dtype and an odd size starts at an offset its dtype cannot be viewed at.
    generator = torch.Generator().manual_seed(4)
    tensors = [
        ("odd.bf16", torch.randn(3, generator=generator).to(torch.bfloat16)),
        ("after.fp32", torch.randn(2, 2, generator=generator)),
        *model_tensors(4),
    ]
    specs = tensor_specs(tensors)
    # 22 bytes: the first two tensors fill a chunk exactly, which stays open (vLLM closes a
    # chunk once it exceeds the size).
    for size in (600, 22):
        wire = _Wire(list(pack_chunks(iter(tensors), size)))
        received: dict[str, torch.Tensor] = {}
        plugin_packed().receive_packed(
            wire,
            [s.name for s in specs],
            [s.dtype for s in specs],
            [list(s.shape) for s in specs],
            size,
            lambda chunk, into=received: into.update((name, t.clone()) for name, t in chunk),
        )
        assert next(wire.chunks, None) is None
        assert digests(list(received.items())) == digests(tensors)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_nccl_without_vllm_in_the_trainer_image_is_a_config_error() -> None:
    with pytest.raises(TrainConfigError, match="needs the vllm package") as caught:
        NcclWeightSync("http://inference:8000/v1", "base-model")
    assert caught.value.field == "spec.weightSync"


# --- in-process, and the factory -----------------------------------------------------------


async def test_in_process_generation_only_tracks_the_version() -> None:
    sync = make_weight_sync("none", None, "toy-policy", RUN, keep=2)
    assert isinstance(sync, NoSync) and isinstance(sync, WeightSync)
    await sync.push(WeightUpdate(7))
    assert (sync.version, sync.model_name(), await sync.ensure_loaded()) == (7, "toy-policy", False)


def test_the_factory_picks_the_implementation_and_names_a_missing_server() -> None:
    assert isinstance(
        make_weight_sync("lora-adapter", "http://inference:8000/v1", "base", RUN, keep=2),
        LoraAdapterSync,
    )
    with pytest.raises(TrainConfigError, match="needs an inference server URL"):
        make_weight_sync("lora-adapter", None, "base", RUN, keep=2)
    with pytest.raises(ValueError, match="keep must be at least 1"):
        make_weight_sync("lora-adapter", "http://inference:8000/v1", "base", RUN, keep=0)


async def test_a_mode_known_only_at_run_time_is_checked_before_the_push(tmp_path: Path) -> None:
    sync = make_weight_sync("lora-adapter", "http://inference:8000/v1", "base", RUN, keep=2)
    with pytest.raises(TypeError, match="LoraAdapterSync pushes AdapterUpdate, not TensorUpdate"):
        await push_update(sync, TensorUpdate(1, iter(model_tensors(1))))
    assert sync.version == 0
    await sync.aclose()
    in_process = make_weight_sync("none", None, "toy-policy", RUN, keep=2)
    await push_update(in_process, AdapterUpdate(2, adapter(tmp_path, 2)))
    assert in_process.version == 2


def test_a_served_weights_mismatch_is_a_weight_sync_finding_of_its_own() -> None:
    from types import SimpleNamespace

    from crl_worker.train.pushes import WeightPushes
    from crl_worker.train.watchdog import Watchdog

    monitor = SimpleNamespace(weight_push=lambda *a, **k: None, weight_sync_problem=lambda r: None)
    job: Any = SimpleNamespace(
        settings=SimpleNamespace(weight_sync="nccl"),
        rank=0,
        broadcast=lambda value: value,
        monitor=monitor,
        watchdog=Watchdog({}),
        trainer=None,
        sync=None,
        policy_version=1,
    )
    pushes = WeightPushes(job)

    def mismatched(version: int) -> str:
        pushes._mismatch = True
        return "the served weights after pushing version 2 are not the trainer's"

    pushes._push_full = mismatched  # type: ignore[method-assign]
    assert pushes._push(2) is False
    assert job.watchdog.state.reason == "WeightsMismatch"
    assert job.policy_version == 1


def test_a_stacked_served_parameter_is_built_from_its_checkpoint_parts() -> None:
    from crl_worker.train.weights.verify import served_name, sources

    names = {f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkvo"} | {
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    }
    key = "dp0:pp0:pcp0:tp0:model.layers.0.self_attn.qkv_proj.weight"
    assert sources(served_name(key), names) == tuple(
        f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"
    )
    assert sources("model.layers.0.mlp.gate_up_proj.weight", names) == (
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    )
    assert sources("model.layers.0.self_attn.o_proj.weight", names) == (
        "model.layers.0.self_attn.o_proj.weight",
    )
    assert sources("model.embed_tokens.weight", names) is None  # not sent: not compared
