"""A job's groups: the processes a loader shares its work and deals its steps over, whatever the framework.

:class:`Collective` is a group as plitzer needs it (this rank, the world, a broadcast from
rank 0 and an all-gather of objects). :class:`TorchGroup` is one over a ``torch.distributed``
process group, which it finds in ``sys.modules`` (this module imports no framework: a process
that uses one has imported it); a user of another launcher passes their own to
``Loader.in_group``. :func:`job_group` says which a loader shares over (docs/design.md, "One
index per job"); :func:`balancer_of` makes a ``balance=True`` loader's deal over it, on a gloo
group of the loader's own (:class:`TorchExchange`, SPEC section 18 rule 4); :func:`join_parts`
checks and merges the checkpoint parts an adapter gathered (:meth:`TorchGroup.merge_parts`);
:func:`groups_of_mesh` and :func:`groups_of_ranks` give a rank's data-parallel and replica groups
(SPEC section 19) from a ``DeviceMesh``, or from every process's data-parallel rank.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from planner.bounded import Bounded
from planner.errors import ConfigError
from plitzer.readpath.balance import NEEDS_GROUP, Balancer, Exchange, ObjectExchange
from plitzer.state.settings import LoaderSettings

__all__ = [
    "AUTO",
    "Collective",
    "TorchExchange",
    "TorchGroup",
    "balancer_of",
    "groups_of_mesh",
    "groups_of_ranks",
    "job_group",
    "join_parts",
    "torch_ready",
]


class Collective(Protocol):
    """A process group as the sharing needs it."""

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        ...

    @property
    def world(self) -> int:
        """The processes of the group."""
        ...

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (the others pass None)."""
        ...

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order."""
        ...


def _dist() -> Any:
    """``torch.distributed`` where this process imported it, else None (never imported here)."""
    return sys.modules.get("torch.distributed")


def torch_ready() -> bool:
    """Whether this process has imported and initialised ``torch.distributed``."""
    dist = _dist()
    return dist is not None and bool(dist.is_available()) and bool(dist.is_initialized())


@dataclass(frozen=True, slots=True)
class TorchGroup:
    """A ``torch.distributed`` process group as a :class:`Collective` (``group=None``: the whole world)."""

    group: Any = None

    @property
    def rank(self) -> int:
        return int(_dist().get_rank(self.group))

    @property
    def world(self) -> int:
        return int(_dist().get_world_size(self.group))

    def broadcast(self, value: Any) -> Any:
        dist = _dist()
        box: list[Any] = [value]
        src = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def all_gather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        _dist().all_gather_object(out, value, group=self.group)
        return out

    def ints_of_all(self, values: list[int]) -> list[tuple[int, ...]]:
        """Every rank's ``values`` (int64, the same length on each), in rank order, on the group's device."""
        torch, dist = sys.modules["torch"], _dist()
        mine = torch.tensor(values, dtype=torch.int64, device=_device(self.group))
        calls = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(calls, mine, group=self.group)
        return [tuple(int(v) for v in c.cpu().tolist()) for c in calls]

    def merge_parts(self, part: bytes, rank: int, world: int) -> bytes:
        """Every rank's checkpoint ``part`` gathered (sizes, then bytes), checked and merged (:func:`join_parts`)."""
        import numpy as np

        torch, dist = sys.modules["torch"], _dist()
        n = dist.get_world_size(self.group)
        dev = _device(self.group)
        info = self.ints_of_all([rank, world, len(part)])
        size = max(length for _, _, length in info)
        buf = torch.zeros(size, dtype=torch.uint8, device=dev)
        buf[: len(part)] = torch.from_numpy(np.frombuffer(part, dtype=np.uint8).copy()).to(dev)
        bufs = [torch.empty_like(buf) for _ in range(n)]
        dist.all_gather(bufs, buf, group=self.group)
        datas = [bytes(b[:length].cpu().numpy()) for (_, _, length), b in zip(info, bufs, strict=True)]
        return join_parts(info, datas, world, n)

    def exchange(self) -> TorchExchange:
        """The loader's own gloo group over this group's ranks, for its balanced steps (SPEC section 18 rule 4).

        Made now, at construction, by every rank of this group (and only them:
        ``use_local_synchronization``), so the read-ahead's collectives never interleave with the
        trainer's own on its group.
        """
        dist = _dist()
        ranks = list(range(dist.get_world_size())) if self.group is None else dist.get_process_group_ranks(self.group)
        own = dist.new_group(ranks, backend="gloo", use_local_synchronization=True)
        return TorchExchange(own, int(dist.get_rank(own)), len(ranks))


@dataclass(frozen=True, slots=True)
class TorchExchange:
    """A :class:`plitzer.readpath.balance.Exchange` over a gloo group: tensors on host memory, no pickling."""

    group: Any
    rank: int
    world: int

    def all_gather_ints(self, values: Any) -> Any:
        import numpy as np

        torch = sys.modules["torch"]
        mine = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
        # A list of tensors: all_gather_into_tensor warns of its deprecation in torch 2.13.
        out = [torch.empty_like(mine) for _ in range(self.world)]
        _dist().all_gather(out, mine, group=self.group)
        return torch.stack(out).numpy()

    def all_to_all_bytes(self, parts: list[bytes], sizes: list[int]) -> list[bytes]:
        import numpy as np

        torch = sys.modules["torch"]
        dist = _dist()
        got_sizes = torch.tensor(sizes, dtype=torch.int64)  # what the deal says each rank sends here
        send = np.frombuffer(b"".join(parts), np.uint8) if any(parts) else np.zeros(0, np.uint8)
        recv = torch.empty(int(got_sizes.sum()), dtype=torch.uint8)
        dist.all_to_all_single(
            recv,
            torch.from_numpy(send.copy()),
            output_split_sizes=got_sizes.tolist(),
            input_split_sizes=[len(p) for p in parts],
            group=self.group,
        )
        flat = recv.numpy()
        ends = np.cumsum(got_sizes.numpy())
        return [flat[e - n : e].tobytes() for e, n in zip(ends.tolist(), got_sizes.tolist(), strict=True)]


def balancer_of(settings: LoaderSettings, group: Any) -> Balancer | None:
    """The deal of a ``balance=True`` loader (SPEC section 18), over ``group`` at world > 1; else None.

    ``group``: a ``torch.distributed`` ProcessGroup (the loader then makes a gloo group of its
    own over the same ranks: collective), a :class:`Collective`, or None (a ConfigError at world > 1).
    Its rank and size must be the loader's ``rank`` and ``world``.
    """
    if not settings.balance:
        return None
    if settings.world == 1:
        return Balancer(None, settings.microbatches)
    resolved = job_group(group, settings) if group is not None else None
    if resolved is None:
        raise ConfigError(NEEDS_GROUP.format(world=settings.world))
    if (resolved.rank, resolved.world) != (settings.rank, settings.world):
        msg = (
            f"balance=True deals over group= (rank {resolved.rank} of {resolved.world}), which must be the "
            f"data-parallel group of rank={settings.rank}, world={settings.world}: pass that group"
        )
        raise ConfigError(msg)
    ex: Exchange = resolved.exchange() if isinstance(resolved, TorchGroup) else ObjectExchange(resolved)
    return Balancer(ex, settings.microbatches)


def _device(group: Any) -> Any:
    """Where a group's collectives run: the CPU for gloo and mpi, else the current accelerator (nccl needs it)."""
    torch, dist = sys.modules["torch"], _dist()
    backend = str(dist.get_backend(group)).lower()
    accelerator = getattr(torch, "accelerator", None)
    ready = bool(accelerator.is_available()) if accelerator is not None else bool(torch.cuda.is_available())
    if "gloo" in backend or "mpi" in backend or not ready:
        return torch.device("cpu")
    if accelerator is not None:
        kind = accelerator.current_accelerator()
        return torch.device(kind.type, accelerator.current_device_index())
    return torch.device("cuda", torch.cuda.current_device())


def _is_collective(value: object) -> bool:
    return all(hasattr(value, a) for a in ("rank", "world", "broadcast", "all_gather"))


AUTO = "auto"
"""``job_group``'s default: over ``torch.distributed``'s world where it fits (see :func:`job_group`)."""


def job_group(group: Any, settings: LoaderSettings) -> Collective | None:
    """The group a :class:`plitzer.Loader` shares its listing, footers and passes over, or None.

    ``group``: :data:`AUTO` shares over the whole ``torch.distributed`` world when this
    process has imported and initialised it with more than one process and the loader's
    ``rank`` and ``world`` are the process's (every rank then builds its loader: a
    collective call); None never shares; a :class:`Collective` or a
    ``torch.distributed.ProcessGroup`` shares over it (every process of it builds its
    loader at the same point). A group of one process shares nothing.
    """
    if group is None:
        return None
    if isinstance(group, str) and group == AUTO:
        dist = _dist()
        if not torch_ready() or dist.get_world_size() <= 1:
            return None
        if (dist.get_rank(), dist.get_world_size()) != (settings.rank, settings.world):
            return None  # another data-parallel layout (tensor parallel, a reference loader): Loader.in_group
        return TorchGroup(None)
    if _is_collective(group):
        out: Collective = group
    elif torch_ready() and isinstance(group, _dist().ProcessGroup):
        out = TorchGroup(group)
    else:
        msg = (
            f"group={type(group).__name__}: give a torch.distributed ProcessGroup (initialised), an object with "
            "rank, world, broadcast and all_gather (plitzer.state.share.Collective), or None (share nothing)"
        )
        raise ConfigError(msg)
    return out if out.world > 1 else None


def join_parts(info: list[tuple[int, ...]], datas: list[bytes], world: int, processes: int) -> bytes:
    """One global checkpoint from every process's part: ``info`` is each process's (data rank, world, bytes).

    Refuses processes that disagree on ``world``, two processes of one data rank at different
    positions, and a data rank no process gave.
    """
    from plitzer.errors import CheckpointError, ConfigError
    from plitzer.state import checkpoint as ckpt

    worlds = sorted({w for _, w, _ in info})
    if worlds != [world]:
        msg = f"ranks disagree on world: {worlds}; every rank's Dataset needs the same world (and lanes)"
        raise ConfigError(msg)
    parts: dict[int, bytes] = {}
    for (r, _, _), data in zip(info, datas, strict=True):
        if parts.setdefault(r, data) != data:
            msg = (
                f"two processes with data rank {r} are at different positions; processes that "
                "share a data rank must consume the same batches"
            )
            raise CheckpointError(msg)
    missing = sorted(set(range(world)) - set(parts))
    if missing:
        msg = (
            f"state_dict() gathered no part from data ranks {missing} of world={world}: the process "
            f"group has {processes} processes; pass group= a group that holds every data rank"
        )
        raise ConfigError(msg)
    try:
        return ckpt.merge(parts[r] for r in range(world))
    except CheckpointError as e:
        msg = f"{e}. Call state_dict() on every rank at the same step"
        raise CheckpointError(msg) from e


def groups_of_mesh(mesh: Any, dp: Any, group: Any, replicas: Any) -> tuple[Any, Any]:
    """The data-parallel group and the replica group of this rank, from a ``DeviceMesh`` (SPEC section 19 rule 3).

    ``dp``: the name or names of the mesh's data-parallel dimensions; the data-parallel group
    runs over them in that order (``("dp_replicate", "dp_shard")``: replicate-major), the replica
    over every other dimension (None where there is none). Made with the default backend, by
    the group's own ranks only (``use_local_synchronization``).
    """
    if mesh is None or dp is None:
        msg = 'mesh= and dp= go together: mesh=device_mesh, dp=("dp_replicate", "dp_shard") (its data-parallel dims)'
        raise ConfigError(msg)
    if group is not None or replicas is not None:
        msg = "give mesh= and dp= (the groups come from the mesh), or group= and replicas=, not both"
        raise ConfigError(msg)
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    dims = (dp,) if isinstance(dp, str) else tuple(dp)
    unknown = [d for d in dims if d not in names]
    if unknown or not dims:
        msg = f"dp={dp!r} names no dimension of the mesh {list(names)}: give its data-parallel dimensions' names"
        raise ConfigError(msg)
    ranks = np.asarray(mesh.mesh.cpu().tolist(), dtype=np.int64).reshape(mesh.mesh.shape)
    coord = mesh.get_coordinate()
    if coord is None:
        msg = "this rank is not in the mesh given as mesh=: pass the mesh this rank trains in"
        raise ConfigError(msg)
    axes = [names.index(d) for d in dims]
    held = tuple(slice(None) if i in axes else coord[i] for i in range(ranks.ndim))
    dp_ranks = ranks[held].transpose([sorted(axes).index(a) for a in axes]).reshape(-1).tolist()
    mine = tuple(coord[i] if i in axes else slice(None) for i in range(ranks.ndim))
    rep_ranks = np.asarray(ranks[mine]).reshape(-1).tolist()
    dist = _dist()
    dp_group = dist.new_group(dp_ranks, use_local_synchronization=True)
    rep_group = dist.new_group(rep_ranks, use_local_synchronization=True) if len(rep_ranks) > 1 else None
    return dp_group, rep_group


_GROUPS: Bounded[tuple[int, int, int, int], tuple[Any, Any]] = Bounded(8)
"""The groups :func:`groups_of_ranks` made, by (default group, data rank, data world, processes): made once a job."""


def groups_of_ranks(dp_rank: int, dp_world: int) -> tuple[Any, Any]:
    """The data-parallel group and the replica group (None: one process a replica) of this process.

    For a trainer that gives its data-parallel rank and degree rather than a mesh (the
    trainers' adapters): the processes of equal data rank are a replica (tensor, context,
    pipeline peers), its lowest global rank its reader; a data-parallel group holds the
    ``i``-th process of each replica. Collective over the default group: one all-gather of
    the data ranks (every process calls it at the same point), then each group made by its
    own ranks only.
    """
    dist = _dist()
    default = dist.distributed_c10d._get_default_group()
    key = (id(default), dp_rank, dp_world, dist.get_world_size())

    def make() -> tuple[Any, Any]:
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, dp_rank)
        replicas: dict[int, list[int]] = {}
        for g, d in enumerate(ranks):
            replicas.setdefault(int(d), []).append(g)
        sizes = {len(v) for v in replicas.values()}
        if sorted(replicas) != list(range(dp_world)) or len(sizes) != 1:
            msg = (
                f"the processes' data-parallel ranks {ranks} do not make {dp_world} replicas of one size: "
                "every data rank 0..world-1 needs the same number of processes"
            )
            raise ConfigError(msg)
        mine = replicas[dp_rank]
        at = mine.index(dist.get_rank())
        dp_group = dist.new_group([replicas[d][at] for d in range(dp_world)], use_local_synchronization=True)
        rep_group = dist.new_group(mine, use_local_synchronization=True) if len(mine) > 1 else None
        return dp_group, rep_group

    return _GROUPS.get_or_make(key, make)
