"""Read chainps checkpoints (safetensors) into torch tensors or numpy arrays.

A checkpoint is what ``chainps checkpoint export`` or a periodic checkpoint wrote: one
``model.safetensors`` file, or shards with a ``model.safetensors.index.json``. Parameters sit
under the names the workers declared, with the shapes they declared (``chainps.torch`` declares
``named_parameters()`` with their shapes), so::

    state = chainps.checkpoint.load("ckpt/step-0000000200")
    model.load_state_dict(state)

Optimizer state (``optim/<slot>/<name>``, torch.optim's slot names) is left out unless asked
for.

A hybrid job's export also holds the workers' all-reduced parameters, under their own names
(marked ``kind/<name>`` = ``local`` in the metadata), so ``load`` returns the whole model; their
local optimizer's state is under ``optim/local/<parameter>/<key>``, and
:func:`local_optimizer_state` gives it in the form ``torch.optim.Optimizer.load_state_dict``
takes. Every tensor's CRC-32 and the header's are checked; a damaged or truncated file raises
:class:`CheckpointError` naming the file and the tensor. Only the standard library and numpy are
needed (torch when ``as_numpy`` is false); the C library is not.
"""

import json
import os
import struct
import zlib

import numpy as np

__all__ = ["CheckpointError", "load", "metadata", "step", "files", "check_shapes", "local_names",
           "load_local", "local_optimizer_state"]

_DTYPES = {"F32": np.dtype("<f4"), "U64": np.dtype("<u8"), "F64": np.dtype("<f8"),
           "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "F16": np.dtype("<f2")}
_HEADER_MAX = 100 << 20  # as the safetensors reference implementation
_OPTIM_PREFIX = "optim/"
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as it is: missing, truncated, corrupt, or not matching
    the model it is loaded into. The message names the file and the tensor."""


def files(path):
    """The safetensors files of a checkpoint and its index metadata (or None).

    ``path`` is a ``.safetensors`` file, an index ``.json`` file, or a directory holding either
    ``model.safetensors`` or ``model.safetensors.index.json``.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, _INDEX)):
            path = os.path.join(path, _INDEX)
        elif os.path.exists(os.path.join(path, _SINGLE)):
            path = os.path.join(path, _SINGLE)
        else:
            raise CheckpointError(f"{path}: no {_SINGLE} or {_INDEX} in this directory")
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint")
    if not path.endswith(".json"):
        return [path], None
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read().decode("utf-8"))
        weight_map = index["weight_map"]
        meta = index.get("metadata", {})
        if not isinstance(weight_map, dict) or not isinstance(meta, dict):
            raise TypeError("weight_map and metadata must be objects")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: not a safetensors index: {e}") from None
    base = os.path.dirname(path)
    names = sorted(set(weight_map.values()))
    for n in names:
        if not isinstance(n, str) or os.path.basename(n) != n:
            raise CheckpointError(f"{path}: shard name {n!r} is not a file in the same directory")
    return [os.path.join(base, n) for n in names], meta


def _read_header(path, raw):
    if len(raw) < 8:
        raise CheckpointError(f"{path}: truncated ({len(raw)} bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > _HEADER_MAX or 8 + n > len(raw):
        raise CheckpointError(f"{path}: header length {n} does not fit in a {len(raw)}-byte file")
    hb = raw[8:8 + n]
    try:
        header = json.loads(hb.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("the header is not an object")
    except ValueError as e:
        raise CheckpointError(f"{path}: header is not valid JSON: {e}") from None
    meta = header.pop("__metadata__", {}) or {}
    want = meta.get("checksum/__header__")
    if want is not None:
        # The writer computed the header's CRC with its own 8 hex digits still zero.
        at = hb.find(b'"checksum/__header__":"crc32:')
        if at < 0 or not want.startswith("crc32:"):
            raise CheckpointError(f"{path}: header checksum entry is malformed")
        at += len(b'"checksum/__header__":"crc32:')
        zeroed = hb[:at] + b"00000000" + hb[at + 8:]
        if f"crc32:{zlib.crc32(zeroed):08x}" != want:
            raise CheckpointError(f"{path}: header checksum mismatch (the header is damaged)")
    return header, meta, 8 + n


def _tensors_of(path, raw, header, meta, data_at, want, verify):
    out = {}
    data_len = len(raw) - data_at
    for name, e in header.items():
        if want is not None and not want(name):
            continue
        try:
            dtype = _DTYPES[e["dtype"]]
            shape = tuple(int(d) for d in e["shape"])
            begin, end = (int(x) for x in e["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r}: malformed entry {e!r}") from None
        numel = int(np.prod(shape, dtype=np.uint64)) if shape else 1
        if any(d < 0 for d in shape) or not 0 <= begin <= end <= data_len or \
                end - begin != numel * dtype.itemsize:
            raise CheckpointError(f"{path}: tensor {name!r}: shape {list(shape)} and dtype "
                                  f"{e['dtype']} do not match data_offsets [{begin}, {end}]")
        view = memoryview(raw)[data_at + begin:data_at + end]
        crc = meta.get(f"checksum/{name}")
        if verify and crc is not None and crc != f"crc32:{zlib.crc32(view):08x}":
            raise CheckpointError(f"{path}: tensor {name!r}: checksum mismatch (the data is "
                                  f"damaged)")
        out[name] = np.frombuffer(view, dtype=dtype).reshape(shape)
    return out


def _load_arrays(path, want=None, verify=True):
    paths, index_meta = files(path)
    arrays, meta = {}, dict(index_meta or {})
    for p in paths:
        try:
            with open(p, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise CheckpointError(f"{p}: cannot read: {e.strerror}") from None
        header, m, data_at = _read_header(p, raw)
        if index_meta is None:
            meta = {k: v for k, v in m.items() if not k.startswith("checksum/")}
        for name, a in _tensors_of(p, raw, header, m, data_at, want, verify).items():
            if name in arrays:
                raise CheckpointError(f"{p}: tensor {name!r} appears in two shards")
            arrays[name] = a
    return arrays, meta


def metadata(path):
    """The checkpoint's metadata: step, mode, optimizer description per tensor (``hparams/...``),
    as a dict of strings."""
    return _load_arrays(path, want=lambda name: False)[1]


def step(path):
    """The training step the checkpoint was cut at (int); a job restored from it resumes there."""
    s = metadata(path).get("step")
    if s is None:
        raise CheckpointError(f"{path}: no step in the metadata")
    return int(s)


def load(path, as_numpy=False, optimizer_state=False, verify=True):
    """Load a checkpoint's parameters as a dict name -> tensor, in their declared shapes.

    Args:
        path: a checkpoint directory, ``.safetensors`` file or index ``.json``.
        as_numpy: return numpy arrays (read-only views are copied so they are writable) instead
            of torch tensors.
        optimizer_state: also return ``optim/<slot>/<name>`` and ``optim/step/<name>``.
        verify: check every CRC-32 (default); a mismatch raises CheckpointError.

    Returns:
        dict, ready for ``model.load_state_dict`` when the model declared its parameters through
        ``chainps.torch`` (same names and shapes). Unsigned step counters become int64.
    """
    want = None if optimizer_state else (lambda name: not name.startswith(_OPTIM_PREFIX))
    arrays, _ = _load_arrays(path, want, verify)
    out = {}
    for name, a in arrays.items():
        if a.dtype == np.dtype("<u8"):
            a = a.astype(np.int64)  # torch has no uint64
        else:
            a = a.copy()  # own, writable memory, not a view of the file's bytes
        out[name] = a
    if as_numpy:
        return out
    import torch

    return {name: torch.from_numpy(a) for name, a in out.items()}


def check_shapes(state, model_state):
    """Raise CheckpointError naming every tensor whose shape differs between a loaded checkpoint
    and a model's ``state_dict()``, and every parameter one has and the other lacks."""
    problems = []
    for name, t in model_state.items():
        if name not in state:
            problems.append(f"{name}: not in the checkpoint")
        elif tuple(state[name].shape) != tuple(t.shape):
            problems.append(f"{name}: checkpoint {list(state[name].shape)}, model "
                            f"{list(t.shape)}")
    for name in state:
        if name not in model_state and not name.startswith(_OPTIM_PREFIX):
            problems.append(f"{name}: not a tensor of the model")
    if problems:
        raise CheckpointError("the checkpoint does not fit the model: " + "; ".join(problems))


_LOCAL_OPTIM = _OPTIM_PREFIX + "local/"
_LOCAL_META = "local/meta/"


def local_names(path, meta=None):
    """The names of the tensors the workers held (all-reduced parameters and their local
    optimizer's state), in file order; empty for an export without any. Raises CheckpointError
    when the export says it has more or fewer than it holds."""
    meta = metadata(path) if meta is None else meta
    names = sorted(k[len("kind/"):] for k, v in meta.items()
                   if k.startswith("kind/") and v == "local")
    want = meta.get("local/tensors")
    if want is None:
        if names:
            raise CheckpointError(f"{path}: local tensors {names} without local/tensors")
        return []
    if str(len(names)) != want:
        raise CheckpointError(f"{path}: the export names {len(names)} local tensors and says it "
                              f"has {want}")
    return names


def load_local(path, verify=True):
    """The workers' local tensors of an export, as a dict name -> float32 torch tensor, every
    checksum verified. A local tensor the metadata names but the file lacks raises
    CheckpointError naming it."""
    arrays, meta = _load_arrays(path, None, verify)
    out = {}
    for name in local_names(path, meta):
        if name not in arrays:
            raise CheckpointError(f"{path}: local (all-reduced) tensor {name!r} is missing")
        out[name] = arrays[name].copy()
    import torch

    return {n: torch.from_numpy(a) for n, a in out.items()}


def local_optimizer_state(path, local=None):
    """The local optimizer's state of a hybrid job's export as ``torch.optim``'s state_dict
    (``{'state': {i: {...}}, 'param_groups': [...]}``, parameters numbered in the order the
    workers gave them), or None when the export has none. ``local``: what :func:`load_local`
    returned, to avoid reading the file twice."""
    meta = metadata(path)
    groups_s = meta.get(_LOCAL_META + "optim/param_groups")
    if groups_s is None:
        return None
    local = load_local(path) if local is None else local
    try:
        groups = json.loads(groups_s)
        extra = json.loads(meta.get(_LOCAL_META + "optim/extra", "{}"))
    except ValueError as e:
        raise CheckpointError(f"{path}: local optimizer metadata is not JSON: {e}") from None
    index, out_groups = {}, []
    for g in groups:
        g = dict(g)
        ids = []
        for name in g["params"]:
            index[name] = len(index)
            ids.append(index[name])
        g["params"] = ids
        out_groups.append(g)
    state = {}
    for key, t in local.items():
        if not key.startswith(_LOCAL_OPTIM):
            continue
        pname, slot = key[len(_LOCAL_OPTIM):].rsplit("/", 1)
        if pname not in index:
            raise CheckpointError(f"{path}: {key}: no parameter {pname!r} in the local optimizer")
        state.setdefault(index[pname], {})[slot] = t
    for pname, slots in extra.items():
        if pname not in index:
            raise CheckpointError(f"{path}: local optimizer state of unknown parameter {pname!r}")
        for slot, v in slots.items():
            if isinstance(v, dict) and set(v) == {"shape"}:
                # A local tensor listed flat (a 0-dim one as one value): its real shape.
                t = state.get(index[pname], {}).get(slot)
                if t is None:
                    raise CheckpointError(f"{path}: local tensor {_LOCAL_OPTIM}{pname}/{slot} "
                                          f"is missing")
                v = t.reshape(v["shape"])
            elif isinstance(v, dict) and set(v) == {"tensor", "dtype"}:
                import torch

                v = torch.tensor(v["tensor"], dtype=getattr(torch, v["dtype"]))
            state.setdefault(index[pname], {})[slot] = v
    return {"state": state, "param_groups": out_groups}
