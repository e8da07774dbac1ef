"""The one to-CPU path: every tensor a rank sends back arrives on the CPU, in any container.

No GPU needed: ``FakeCuda`` tensors (and ``FakeCudaParameter``s) are CPU
tensors that report ``cuda:0`` until copied; their ``cpu()`` records each
copy and returns a copy that reports the CPU, as a CUDA tensor's would.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import torch

from nbddp.rank.worker import error_info
from nbddp.wire import values
from nbddp.wire.shm import SHARE_BYTES

CUDA0 = torch.device("cuda", 0)
ON_FAKE_CUDA: set[int] = set()  # ids of the tensors that report cuda:0 (tests keep them alive)
COPIES: list[torch.Tensor] = []  # every copy made by their cpu()


class _ReportsCuda:
    """Says it is on cuda:0 while its id is in ``ON_FAKE_CUDA``."""

    @property
    def device(self) -> torch.device:
        return CUDA0 if id(self) in ON_FAKE_CUDA else super().device  # type: ignore[misc]

    def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        assert id(self) in ON_FAKE_CUDA, "a CPU tensor was copied"
        copy = torch.Tensor.detach(self).clone()  # type: ignore[arg-type]
        COPIES.append(copy)
        return copy


class FakeCuda(_ReportsCuda, torch.Tensor):
    """A tensor subclass with the default ``__torch_function__``: ``cpu()`` keeps the type."""


class FakeCudaParameter(_ReportsCuda, torch.nn.Parameter):
    """A parameter: ``__torch_function__`` off, ``cpu()`` gives a plain tensor."""


def on_fake_cuda(tensor: torch.Tensor) -> FakeCuda:
    fake = tensor.as_subclass(FakeCuda)
    ON_FAKE_CUDA.add(id(fake))
    return fake


def fake_parameter(tensor: torch.Tensor, requires_grad: bool = True) -> FakeCudaParameter:
    param = FakeCudaParameter(tensor, requires_grad=requires_grad)
    ON_FAKE_CUDA.add(id(param))
    return param


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    ON_FAKE_CUDA.clear()
    COPIES.clear()


def round_trip(value: object) -> Any:
    return values.unpack(values.pack(value))


def tensors(value: object) -> Iterator[torch.Tensor]:
    """Every tensor inside ``value`` (the containers these tests build)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors(item)
    elif isinstance(value, list | tuple | set):
        for item in value:
            yield from tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from tensors(getattr(value, f.name))


def assert_all_on_cpu(value: object, count: int) -> None:
    found = list(tensors(value))
    assert len(found) == count
    for tensor in found:
        assert tensor.device.type == "cpu" and id(tensor) not in ON_FAKE_CUDA


class Pair(NamedTuple):
    weight: torch.Tensor
    bias: torch.Tensor


@dataclasses.dataclass
class Checkpoint:
    step: int
    state: dict[str, torch.Tensor]
    extra: list[torch.Tensor] = dataclasses.field(default_factory=list)


def test_the_stand_in_reports_cuda_until_copied() -> None:
    fake = on_fake_cuda(torch.ones(2))
    assert fake.device == CUDA0
    copy = fake.cpu()
    assert copy.device.type == "cpu" and len(COPIES) == 1 and COPIES[0] is copy


def test_a_bare_tensor_comes_back_on_the_cpu_with_its_values() -> None:
    back = round_trip(on_fake_cuda(torch.arange(6.0).reshape(2, 3)))
    assert back.device.type == "cpu"
    assert torch.equal(back, torch.arange(6.0).reshape(2, 3))
    assert len(COPIES) == 1


def test_ordered_dict_keeps_its_type_and_order() -> None:
    value = collections.OrderedDict(z=on_fake_cuda(torch.ones(2)), a=on_fake_cuda(torch.zeros(3)))
    back = round_trip(value)
    assert type(back) is collections.OrderedDict and list(back) == ["z", "a"]
    assert_all_on_cpu(back, 2)
    assert torch.equal(back["z"], torch.ones(2)) and torch.equal(back["a"], torch.zeros(3))


def test_namedtuple_keeps_its_type() -> None:
    back = round_trip(Pair(on_fake_cuda(torch.ones(2)), on_fake_cuda(torch.full((1,), 5.0))))
    assert type(back) is Pair
    assert_all_on_cpu(back, 2)
    assert torch.equal(back.bias, torch.full((1,), 5.0))


def test_dataclass_with_nested_containers() -> None:
    value = Checkpoint(
        step=7,
        state={"w": on_fake_cuda(torch.eye(2))},
        extra=[on_fake_cuda(torch.ones(1)), on_fake_cuda(torch.zeros(1))],
    )
    back = round_trip(value)
    assert type(back) is Checkpoint and back.step == 7
    assert_all_on_cpu(back, 3)
    assert torch.equal(back.state["w"], torch.eye(2))


def test_deep_nesting_sets_tuples_and_defaultdicts() -> None:
    inner = collections.defaultdict(list, {"t": [(on_fake_cuda(torch.ones(1)),)]})
    value = {"a": [{"b": inner}], "c": (1, "x", on_fake_cuda(torch.zeros(2)))}
    back = round_trip(value)
    assert type(back["a"][0]["b"]) is collections.defaultdict
    assert_all_on_cpu(back, 2)
    assert back["c"][:2] == (1, "x")


def test_objects_attributes_are_reached() -> None:
    class Holder:  # defined here: cloudpickle sends it by value, as a notebook's class
        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

    back = round_trip(Holder(on_fake_cuda(torch.ones(3))))
    assert back.tensor.device.type == "cpu" and torch.equal(back.tensor, torch.ones(3))


def test_parameters_stay_parameters_with_requires_grad() -> None:
    value = {
        "trained": fake_parameter(torch.ones(2)),
        "frozen": fake_parameter(torch.zeros(2), requires_grad=False),
    }
    back = round_trip(value)
    assert_all_on_cpu(back, 2)
    for name, grad in (("trained", True), ("frozen", False)):
        assert type(back[name]) is torch.nn.Parameter
        assert back[name].requires_grad is grad
    assert torch.equal(back["trained"].data, torch.ones(2))


def test_tensor_subclass_and_attributes_are_kept() -> None:
    fake = on_fake_cuda(torch.ones(2))
    fake.scale = 0.5  # type: ignore[attr-defined]
    back = round_trip(fake)
    assert type(back) is FakeCuda and back.device.type == "cpu"
    assert back.scale == 0.5


def test_leaf_keeps_requires_grad_and_graph_members_come_back_detached() -> None:
    leaf = on_fake_cuda(torch.ones(2)).requires_grad_()
    ON_FAKE_CUDA.add(id(leaf))
    computed = leaf * 2  # in an autograd graph: a CPU tensor like this would not even pickle
    ON_FAKE_CUDA.add(id(computed))
    back = round_trip({"leaf": leaf, "computed": computed})
    # (torch rebuilds a subclass that requires grad as an alias: not is_leaf, CPU or not)
    assert back["leaf"].requires_grad
    assert not back["computed"].requires_grad
    assert torch.equal(back["computed"], torch.full((2,), 2.0))


def test_a_tensor_reached_twice_is_copied_once_and_stays_one_object() -> None:
    shared = on_fake_cuda(torch.ones(4))
    back = round_trip({"a": shared, "b": [shared]})
    assert back["a"] is back["b"][0]
    assert len(COPIES) == 1


def test_cpu_tensors_are_not_copied_and_rank_values_are_left_alone() -> None:
    plain = torch.ones(3)
    fake = on_fake_cuda(torch.zeros(1))
    value = {"plain": plain, "fake": fake}
    back = round_trip(value)
    assert len(COPIES) == 1  # only the one on the (fake) GPU
    assert torch.equal(back["plain"], plain)
    assert value["fake"] is fake and fake.device == CUDA0  # the rank keeps its own


def test_a_real_state_dict_made_to_report_cuda() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model(torch.randn(5, 3))  # running stats and num_batches_tracked move off their defaults
    state = model.state_dict()
    expected = {k: v.clone() for k, v in state.items()}
    for key in state:
        state[key] = on_fake_cuda(state[key])
    back = round_trip(state)
    assert type(back) is collections.OrderedDict
    assert list(back) == list(expected)
    assert back._metadata == state._metadata  # load_state_dict reads it (versions)
    assert_all_on_cpu(back, len(expected))
    assert len(COPIES) == len(expected)
    for key, value in expected.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value)
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    fresh.load_state_dict(back)
    assert torch.equal(fresh[1].running_mean, expected["1.running_mean"])


def test_real_cpu_parameters_keep_container_and_parameter_types() -> None:
    state = collections.OrderedDict(w=torch.nn.Parameter(torch.ones(2)), b=torch.zeros(1))
    back = round_trip(state)
    assert type(back) is collections.OrderedDict
    assert isinstance(back["w"], torch.nn.Parameter) and back["w"].requires_grad
    assert torch.equal(back["b"], torch.zeros(1))


def test_a_cpu_method_that_stays_on_the_device_is_refused() -> None:
    class Stuck(FakeCuda):
        def cpu(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            return self

    stuck = torch.ones(1).as_subclass(Stuck)
    ON_FAKE_CUDA.add(id(stuck))
    with pytest.raises(TypeError, match=r"Stuck.cpu\(\) returned a tensor on cuda:0"):
        values.pack(stuck)


def test_exceptions_travel_with_their_tensors_on_the_cpu() -> None:
    fake = on_fake_cuda(torch.full((2,), 3.0))  # held here: its id must not be reused
    try:
        raise ValueError("bad batch", fake)
    except ValueError as exc:
        info = error_info(exc)
    assert info.type_name == "builtins.ValueError"
    assert info.exc is not None
    rebuilt = values.unpack(info.exc)
    assert type(rebuilt) is ValueError and rebuilt.args[0] == "bad batch"
    assert rebuilt.args[1].device.type == "cpu"
    assert torch.equal(rebuilt.args[1], torch.full((2,), 3.0))


def test_a_large_value_is_copied_into_shared_memory_never_moved_and_outlives_packing() -> None:
    big = torch.arange(SHARE_BYTES // 4 + 1, dtype=torch.float32)
    fake = on_fake_cuda(big.clone())
    packed = values.pack({"cpu": big, "gpu": fake})
    gc.collect()  # the GPU value's shared copy is the packed value's, not the pickler's
    back = values.unpack(packed)
    assert not big.untyped_storage().is_shared()  # the rank's own tensor stays where it is
    assert torch.equal(back["cpu"], big) and torch.equal(back["gpu"], big)
