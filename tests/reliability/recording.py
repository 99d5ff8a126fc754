"""Test-only recorder of every share-transport message of a job, and the searches that use it.

How it gets into the real processes. :func:`write_sitecustomize` writes a three-line
``sitecustomize.py`` into a temporary directory; the leak test puts that directory on PYTHONPATH
and sets :data:`ENV` before :class:`coordinator.consortium.LocalConsortium` starts the daemons.
Python imports ``sitecustomize`` at start-up in every daemon and in every job worker the daemons
``spawn`` (they inherit the environment), and it calls :func:`install`. Nothing in ``mpc_erm``,
``parties`` or ``coordinator`` refers to this module or to the variable: production processes never
load it, and no product file was changed for it.

What :func:`install` does. It registers an import hook that wraps, right after their modules are
executed and before any job uses them:

* ``PeerClient.deliver`` — the exact header and payload bytes a member hands to gRPC for one
  message (before chunking; the gRPC framing adds no data): one ``sent`` record per message;
* ``JobBox.put`` — the exact header and payload a member's mailbox stored: one ``recv`` record;
* ``Endpoint._take_seq`` (send side) — which protocol step the sender was in (a label: ``aggregate``,
  ``beaver``, ``beaver_square``, ``beaver_and``, ``and_chain``, ``b2a``, ``wraps``, ``noise``; empty
  for set-up traffic such as CrypTen's seeds or the agreement);
* ``OwnerIntake.Enroll`` / ``Contribute`` / ``GetRound`` (issue 17) — every request a data owner
  sent a compute party's owner intake, serialised as received, before the handler can refuse it:
  one ``owner_in`` record (its kind, the owner, the round, the compute party's rank);
* test-only plaintext dumps (``plain`` records, written by the party's own worker, never sent):
  each aggregate's contributions, public weights, the local weighted sum v_i, the grid bits g and
  the revealed result; this party's noise shares; its local model (output perturbation); the
  pairwise mask keys it holds; at an owner intake, the party's share sum of each round and each
  published state.

Records go to ``$MPC_ERM_TEST_RECORD_DIR/rec-<pid>.bin``, written unbuffered one record at a time
(the worker leaves with ``os._exit``). Format: u32 meta length, meta JSON, u32 header length,
header bytes (a serialised ``transport.Header``), u64 payload length, payload.

TLS: a capture on the loopback interface (tcpdump/tshark) would show only TLS 1.3 records, so the
plaintext side of the transport is where messages can be inspected; this recorder sits there.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ENV = "MPC_ERM_TEST_RECORD_DIR"

SITECUSTOMIZE = (
    "import os\n"
    f"if os.environ.get({ENV!r}):\n"
    "    from tests.reliability.recording import install\n"
    "    install()\n"
)


def write_sitecustomize(directory: Path) -> Path:
    """The start-up hook for the daemons' interpreters (put ``directory`` on PYTHONPATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sitecustomize.py"
    path.write_text(SITECUSTOMIZE)
    return path


def start_recorded(cons: Any, site: Path, rec: Path) -> None:
    """Start ``cons`` (a written ``LocalConsortium``) with the recorder in its daemons and their job
    workers only: the hook in ``site`` on their PYTHONPATH, records under ``rec``; this process's
    environment is as before."""
    write_sitecustomize(site)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", ENV)}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [saved["PYTHONPATH"]])])
    os.environ[ENV] = str(rec)
    try:
        cons.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# =============================================================================== process side


class _Writer:
    """Appends records to this process's file; one write call per record, thread-safe."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._file: Any = None
        self._pid = -1

    def write(self, meta: dict[str, Any], header: bytes = b"", payload: bytes = b"") -> None:
        m = json.dumps(meta, separators=(",", ":"), default=str).encode()
        blob = b"".join([struct.pack("<I", len(m)), m, struct.pack("<I", len(header)), header,
                         struct.pack("<Q", len(payload)), payload])
        with self._lock:
            if self._file is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._file = open(os.path.join(self.directory, f"rec-{self._pid}.bin"), "ab", buffering=0)
            self._file.write(blob)


_writer: _Writer | None = None
_labels: list[str] = []  # the protocol steps this process is inside (main thread; innermost last)
_send_labels: dict[tuple[str, int, int, int], str] = {}
_installed = False


def _label() -> str:
    return _labels[-1] if _labels else ""


def _labelled(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _labels.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _labels.pop()

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def _arr(t: Any) -> bytes:
    return np.ascontiguousarray(t.detach().to("cpu").numpy()).tobytes()


def _plain(kind: str, member: str, job_id: str, payload: bytes = b"", **extra: Any) -> None:
    assert _writer is not None
    _writer.write({"dir": "plain", "kind": kind, "member": member, "job": job_id, "pid": os.getpid(), **extra},
                  payload=payload)


def _header_meta(header: Any) -> dict[str, Any]:
    key = header.key
    meta: dict[str, Any] = {"job": key.job_id, "src": key.src, "dst": key.dst, "seq": key.seq, "op": header.op,
                            "kind": int(header.kind)}
    if header.HasField("tensor"):
        meta["dtype"] = header.tensor.dtype
        meta["shape"] = list(header.tensor.shape)
    return meta


def _patch_client(mod: ModuleType) -> None:
    orig = mod.PeerClient.deliver

    def deliver(self: Any, header: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        key = header.key
        label = _send_labels.pop((key.job_id, key.src, key.dst, key.seq), "")
        meta = {"dir": "sent", "member": self.table.member(self.my_rank).name, "pid": os.getpid(), "label": label,
                **_header_meta(header)}
        assert _writer is not None
        _writer.write(meta, header.SerializeToString(), bytes(data))
        return orig(self, header, data, *args, **kwargs)

    mod.PeerClient.deliver = deliver


def _patch_mailbox(mod: ModuleType) -> None:
    orig = mod.JobBox.put

    def put(self: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
        data = bytes(message.data)  # before the receiver can take (and reuse) the buffer
        out = orig(self, message, *args, **kwargs)  # refused duplicates raise before being recorded
        meta = {"dir": "recv", "member": self.table.member(self.local_rank).name, "pid": os.getpid(),
                **_header_meta(message.header)}
        assert _writer is not None
        _writer.write(meta, message.header.SerializeToString(), data)
        return out

    mod.JobBox.put = put


def _patch_endpoint(mod: ModuleType) -> None:
    orig = mod.Endpoint._take_seq

    def _take_seq(self: Any, table: dict[int, int], rank: int) -> int:
        seq = orig(self, table, rank)
        if table is self._send_seq:  # the posting thread, in program order: its label is the step's
            _send_labels[(self.job_id, self.rank, rank, seq)] = _label()
        return seq

    mod.Endpoint._take_seq = _take_seq


def _patch_aggregator(mod: ModuleType) -> None:
    import torch

    cls = mod.MpcAggregator
    orig_aggregate, orig_keys, orig_shares = cls.aggregate, cls._exchange_keys, cls.aggregate_shares

    def _ids(self: Any) -> tuple[str, str]:
        table = self.comm.table
        return table.member(self.rank).name, table.job_id

    def aggregate(self: Any, contributions: Any, weights: Any, noise: Any) -> Any:
        member, job = _ids(self)
        t = self._counter
        # the same expression as MpcAggregator.aggregate: bit-identical v_i
        local = weights.detach().to("cpu", torch.float64) @ contributions.detach().to("cpu", torch.float64)
        _labels.append("aggregate")
        try:
            out = orig_aggregate(self, contributions, weights, noise)
        finally:
            _labels.pop()
        p = int(contributions.shape[1])
        info = {"t": t, "g": int(self.precision_bits), "p": p, "noise": noise.mechanism}
        _plain("contributions", member, job, _arr(contributions.to(torch.float64)),
               shape=list(contributions.shape), **info)
        _plain("weights", member, job, _arr(weights.to(torch.float64)), **info)
        _plain("local", member, job, _arr(local), **info)
        _plain("result", member, job, _arr(out.to(torch.float64)), **info)
        return out

    def _exchange_keys(self: Any) -> dict[int, bytes]:
        keys = orig_keys(self)
        member, job = _ids(self)
        for j, k in sorted(keys.items()):
            _plain("pair_key", member, job, bytes(k), peer=j)
        return keys

    def aggregate_shares(self: Any, owner_share_sum: Any, grid_bits: int, noise: Any) -> Any:
        """A compute party's share sum of its owners' contributions: its input to the MPC."""
        _member, job = _ids(self)
        _plain("owner_share_sum", f"rank{self.rank}", job, _arr(owner_share_sum.to(torch.int64)), t=self._counter)
        return orig_shares(self, owner_share_sum, grid_bits, noise)

    cls.aggregate, cls._exchange_keys, cls.aggregate_shares = aggregate, _exchange_keys, aggregate_shares


def _patch_noise(mod: ModuleType) -> None:
    cls = mod.InMpcNoise
    orig_take = cls.take

    def take(self: Any, p: int, spec: Any) -> Any:
        z = orig_take(self, p, spec)
        table = self._comm.table
        _plain("noise_share", table.member(self._comm.get_rank()).name, table.job_id, _arr(z),
               g=int(self.precision_bits(spec, p)), p=p)
        return z

    cls.take = take


def _patch_pool(mod: ModuleType) -> None:
    mod.NoisePool.produce = _labelled("noise", mod.NoisePool.produce)


def _patch_output(mod: ModuleType) -> None:
    cls = mod.OutputPerturbation
    orig = cls.local_model

    def local_model(self: Any, X: Any, y: Any) -> Any:
        theta = orig(self, X, y)
        import crypten.communicator as comm  # the worker joined its session before the solve

        c = comm.get()
        table = c.table
        _plain("local_model", table.member(c.get_rank()).name, table.job_id, _arr(theta.to("cpu").double()))
        return theta

    cls.local_model = local_model


def _patch_beaver(mod: ModuleType) -> None:
    name = "__beaver_protocol"  # mul/matmul look it up in the module's globals at call time
    setattr(mod, name, _labelled("beaver", getattr(mod, name)))
    for fn, label in (("square", "beaver_square"), ("AND", "beaver_and"), ("B2A_single_bit", "b2a"),
                      ("wraps", "wraps")):
        setattr(mod, fn, _labelled(label, getattr(mod, fn)))


def _patch_sampler_bits(mod: ModuleType) -> None:
    """The in-MPC samplers' own Beaver steps on bit words (patched as the module is first imported,
    so the coin circuit and the samplers, which import them by name, get the labelled ones; a
    renamed step is simply left unlabelled and counted with the other sampler openings)."""
    for fn, label in (("and_many", "beaver_and"), ("b2a_bits", "b2a")):
        if callable(getattr(mod, fn, None)):
            setattr(mod, fn, _labelled(label, getattr(mod, fn)))


def _patch_sampler_coins(mod: ModuleType) -> None:
    """The coin circuit's comparison chain with triple planes (looked up by name at call time)."""
    if callable(getattr(mod, "_chain_triple_planes", None)):
        mod._chain_triple_planes = _labelled("and_chain", mod._chain_triple_planes)


def _patch_owner_intake(mod: ModuleType) -> None:
    """A compute party's owner intake (issue 17): every request an owner sent it, as received (one
    ``owner_in`` record: the serialised request, before the handler can refuse it), and its own
    plaintext: each round's published state (its input to the MPC, the share sum, is recorded at
    MpcAggregator.aggregate_shares)."""
    cls = mod.OwnerIntake

    def received(kind: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        def handler(self: Any, request: Any, context: Any) -> Any:
            from mpc_erm.mpc import tls

            assert _writer is not None
            _writer.write({"dir": "owner_in", "kind": kind, "rank": self.frame.rank, "job": request.job_id,
                           "owner": tls.peer(context).name, "round": int(getattr(request, "round", -1)),
                           "pid": os.getpid()}, payload=request.SerializeToString())
            return orig(self, request, context)

        return handler

    orig_publish = cls.publish

    def publish(self: Any, t: int, state: Any, roster: Any, signatures: Any = ()) -> None:
        import torch

        _plain("owner_release", f"rank{self.frame.rank}", self.frame.job_id, _arr(state.to(torch.float64)), t=t,
               counted=roster.count)
        orig_publish(self, t, state, roster, signatures)

    cls.Enroll = received("enroll", cls.Enroll)
    cls.Contribute = received("contribute", cls.Contribute)
    cls.GetRound = received("get_round", cls.GetRound)
    cls.publish = publish


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "mpc_erm.mpc.transport.client": _patch_client,
    "mpc_erm.mpc.transport.mailbox": _patch_mailbox,
    "mpc_erm.mpc.transport.endpoint": _patch_endpoint,
    "mpc_erm.mpc.aggregator": _patch_aggregator,
    "mpc_erm.mpc.noise": _patch_noise,
    "mpc_erm.mpc.samplers.pool": _patch_pool,
    "mpc_erm.mpc.samplers.bits": _patch_sampler_bits,
    "mpc_erm.mpc.samplers.coins": _patch_sampler_coins,
    "mpc_erm.protocols.output_perturbation": _patch_output,
    "crypten.mpc.primitives.beaver": _patch_beaver,
    "parties.owner.intake": _patch_owner_intake,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs PATCHES[name](module) right after the module's own code."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Called by the sitecustomize hook when :data:`ENV` names the record directory."""
    global _writer, _installed
    if _installed:
        return
    directory = os.environ[ENV]
    os.makedirs(directory, exist_ok=True)
    _writer = _Writer(directory)
    sys.meta_path.insert(0, _AfterImport())
    _installed = True


# =============================================================================== test side


@dataclass
class Record:
    meta: dict[str, Any]
    header: bytes
    payload: bytes

    @property
    def dir(self) -> str:
        return str(self.meta["dir"])

    def int64(self) -> np.ndarray:
        return np.frombuffer(self.payload, dtype="<i8")

    def float64(self) -> np.ndarray:
        return np.frombuffer(self.payload, dtype="<f8")


def read_records(directory: Path) -> Iterator[Record]:
    """Every record of every process file under ``directory`` (a torn last record is dropped)."""
    for path in sorted(Path(directory).glob("rec-*.bin")):
        raw = path.read_bytes()
        off = 0
        while off + 4 <= len(raw):
            try:
                (n,) = struct.unpack_from("<I", raw, off)
                meta = json.loads(raw[off + 4: off + 4 + n])
                off += 4 + n
                (h,) = struct.unpack_from("<I", raw, off)
                header = raw[off + 4: off + 4 + h]
                off += 4 + h
                (pl,) = struct.unpack_from("<Q", raw, off)
                payload = raw[off + 8: off + 8 + pl]
                off += 8 + pl
            except (struct.error, ValueError):
                break
            if len(payload) != pl:
                break
            yield Record(meta, header, payload)


def _informative(a: np.ndarray) -> np.ndarray:
    """Per row: how many bytes are neither 0x00 nor 0xff (zero or sign padding)."""
    return ((a != 0) & (a != 255)).sum(axis=1)


class NeedleSet:
    """Byte strings searched for at every byte offset of a haystack, many at once.

    A group is an (N, L) uint8 array of needles of one length, with the 8-byte window at
    ``anchor`` used as the lookup key; a hit on the key is then compared in full. Needles with
    fewer than ``MIN_INFORMATIVE`` bytes that are neither 0x00 nor 0xff, or whose anchor window
    is all padding, are left out (counted in ``skipped``): a value like 0 or 5 999 occurs by chance
    in sizes, counters and headers and would be a false alarm; such values are covered by the
    longer needles (runs of consecutive values) where their neighbours are informative.
    """

    MIN_INFORMATIVE = 3

    def __init__(self) -> None:
        self.groups: list[tuple[str, np.ndarray, int]] = []
        self.skipped: dict[str, int] = {}
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def count(self) -> int:
        return sum(len(d) for _, d, _ in self.groups)

    def add(self, label: str, data: np.ndarray, anchor: int = 0) -> int:
        """Add the distinct rows of ``data`` (N, L) uint8; returns how many were kept."""
        data = np.ascontiguousarray(data, dtype=np.uint8)
        if data.ndim != 2 or data.shape[0] == 0:
            return 0
        width = data.shape[1]
        data = np.unique(data.view(f"V{width}").ravel()).view(np.uint8).reshape(-1, width)  # no duplicates
        ok = (_informative(data) >= self.MIN_INFORMATIVE) & (_informative(data[:, anchor: anchor + 8]) >= 1)
        self.skipped[label] = self.skipped.get(label, 0) + int((~ok).sum())
        data = data[ok]
        if len(data):
            self.groups.append((label, data, anchor))
            self._index = None
        return len(data)

    def _build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        keys, gids, rows = [], [], []
        for g, (_, data, anchor) in enumerate(self.groups):
            keys.append(np.ascontiguousarray(data[:, anchor: anchor + 8]).view("<u8").ravel())
            gids.append(np.full(len(data), g, dtype=np.int32))
            rows.append(np.arange(len(data), dtype=np.int64))
        k, gi, ro = np.concatenate(keys), np.concatenate(gids), np.concatenate(rows)
        order = np.argsort(k, kind="stable")
        table = np.zeros(1 << 24, dtype=bool)
        table[(k & np.uint64(0xFFFFFF)).astype(np.intp)] = True
        return k[order], gi[order], ro[order], table

    def search(self, hay: np.ndarray) -> list[tuple[int, str, int]]:
        """(start, label, length) of every needle found in ``hay`` (uint8), any alignment."""
        if not self.groups or hay.size < 8:
            return []
        if self._index is None:
            self._index = self._build()
        keys, gids, rows, table = self._index
        found = set()
        for a in range(8):
            n = (hay.size - a) // 8
            if n <= 0:
                continue
            words = hay[a: a + 8 * n].view("<u8")
            cand = np.flatnonzero(table[(words & np.uint64(0xFFFFFF)).astype(np.intp)])
            if cand.size == 0:
                continue
            w = words[cand]
            lo = np.searchsorted(keys, w, "left")
            hi = np.searchsorted(keys, w, "right")
            for i in np.flatnonzero(hi > lo):
                pos = a + 8 * int(cand[i])
                js = np.arange(lo[i], hi[i])
                for g in np.unique(gids[js]):  # every needle with this key, one group at a time
                    label, data, anchor = self.groups[int(g)]
                    start, width = pos - anchor, data.shape[1]
                    if start < 0 or start + width > hay.size:
                        continue
                    same = data[rows[js[gids[js] == g]]] == hay[start: start + width]
                    if same.all(axis=1).any():
                        found.add((start, label, width))
        return sorted(found)


def value_bytes(values: np.ndarray, dtype: str) -> np.ndarray:
    """(n, itemsize) little-endian bytes of each value."""
    v = np.ascontiguousarray(np.asarray(values).reshape(-1).astype(dtype))
    return v.view(np.uint8).reshape(v.size, -1)


def runs(per_value: np.ndarray, k: int) -> np.ndarray:
    """Rows of k consecutive values (each row the concatenated bytes)."""
    if per_value.shape[0] < k:
        return np.zeros((0, per_value.shape[1] * k), dtype=np.uint8)
    w = np.lib.stride_tricks.sliding_window_view(per_value, k, axis=0)  # (n-k+1, itemsize, k)
    return np.ascontiguousarray(w.transpose(0, 2, 1)).reshape(w.shape[0], -1)


def bit_counts(values: np.ndarray) -> np.ndarray:
    """How many of ``values`` (int64) have each of the 64 bits set."""
    u = values.astype("<i8").view("<u8")
    return np.array([int(np.count_nonzero((u >> np.uint64(b)) & np.uint64(1))) for b in range(64)])


def uniformity(values: np.ndarray) -> dict[str, Any]:
    """p-values of three tests of "uniform 64-bit ring elements": the smallest of 64 two-sided
    binomial tests of each bit against Bernoulli(1/2) (Bonferroni: times 64), a chi-square test of
    the 256-bin byte histogram, and a KS test of the top 32 bits against U[0, 2^32)."""
    from scipy import stats

    v = np.ascontiguousarray(values.astype("<i8"))
    n = v.size
    counts = bit_counts(v)
    bit_p = [stats.binomtest(int(c), n, 0.5).pvalue for c in counts]
    worst = int(np.argmin(bit_p))
    hist = np.bincount(v.view(np.uint8), minlength=256)
    chi = stats.chisquare(hist)
    top = (v.view("<u8") >> np.uint64(32)).astype(np.float64) / 2.0**32
    ks = stats.kstest(top, "uniform")
    return {
        "n": int(n),
        "bits_p_bonferroni": min(1.0, 64 * bit_p[worst]),
        "worst_bit": worst,
        "worst_bit_ones": int(counts[worst]),
        "bytes_chi2_p": float(chi.pvalue),
        "top32_ks_p": float(ks.pvalue),
    }
